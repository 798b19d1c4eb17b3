/*
** page.c — the report's HTML page (report.h): one file that opens offline. It inlines the
** run's JSON document, uPlot's stylesheet and script with their licence (report/vendor/,
** from npm by scripts/vendor-js.sh), and the page's own script and styles (report/page.js,
** page.css), all embedded into prl at build time (report/embed.cmake). The page's script
** draws every curve with uPlot; this file only assembles the text.
*/
#include "report/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* report/embed.cmake's arrays (assets.c, generated at build time) */
extern const char report_uplot_js[], report_uplot_css[], report_uplot_license[];
extern const char report_page_js[], report_page_css[];

/* The document as JSON text safe inside a <script> element: '<' only occurs inside JSON
** strings, so writing it as \u003c keeps "</script>" and "<!--" out of the element. */
static void put_json(FILE *f, const char *json)
{
    for (const char *p = json; *p; p++) {
        if (*p == '<') fputs("\\u003c", f);
        else fputc(*p, f);
    }
}

static void page(FILE *f, const char *json)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          "<meta name=\"generator\" content=\"prl report\">\n<title>prl report</title>\n",
          f);
    fprintf(f, "<style>\n%s\n</style>\n<style>\n%s\n</style>\n</head><body>\n", report_uplot_css,
            report_page_css);
    fputs("<noscript>This report draws its plots with JavaScript: allow scripts for this "
          "file.</noscript>\n<div id=\"app\"></div>\n",
          f);
    fputs("<script type=\"application/json\" id=\"prl-data\">", f);
    put_json(f, json);
    fputs("</script>\n", f);
    /* uPlot's MIT licence travels with its code */
    fprintf(f, "<script>\n/* uPlot (https://github.com/leeoniya/uPlot), vendored from npm:\n%s*/\n",
            report_uplot_license);
    fprintf(f, "%s\n</script>\n<script>\n%s\n</script>\n</body></html>\n", report_uplot_js,
            report_page_js);
}

prl_status prl_report_write_page(const char *path, const json_t *doc)
{
    /* 8 significant digits: every metric keeps its precision, the page stays small */
    char *json = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(8));
    if (!json) return prl_error_set(PRL_ERR_NOMEM, "report JSON");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        free(json);
        return prl_error_set(PRL_ERR_NOMEM, "report page");
    }
    page(f, json);
    free(json);
    if (fclose(f) != 0) {
        free(buf);
        return prl_error_set(PRL_ERR_NOMEM, "report page");
    }
    prl_status rc = prl_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}
