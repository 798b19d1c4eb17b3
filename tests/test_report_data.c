/*
** test_report_data.c — Check tests for report/'s document and page (the page in a browser is
** tests/test_report.sh's).
**
** Covers: a GRPO run.db read into the document (steps in step order with "step" first, the
** events with their detail, at most N samples a step, their ids, log-probs and mask, tokens
** as [id] without a tokenizer and as text with one, the run's kind from opd.enabled); an SFT
** folder's metrics.jsonl (a torn last line skipped, a bad line named FILE:LINE, an empty file
** refused); a folder with neither refused; the page inlines the document so that no string in
** the run (here "</script>") can end its <script> element, and the JSON in it parses back.
*/
#include "report/report.h"
#include "store/store.h"

#include "tests/check_util.h"
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64], rundir[128];

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/prl-report-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(rundir, sizeof rundir, "%s/demo", tmpdir);
    ck_assert_int_eq(mkdir(rundir, 0755), 0);
}

static void teardown(void) { check_remove_tree(tmpdir); }

/* runs/demo/run.db: `steps` steps written out of order, each with `per_step` samples of
** prompt "p</script>" (ids 65 + i, log-probs -i/4, mask 1 0 1 ...), two events. */
static void make_run(const char *config, int steps, int per_step)
{
    char path[256];
    snprintf(path, sizeof path, "%s/run.db", rundir);
    prl_store *db;
    int64_t run;
    assert_ok(prl_store_open(path, &db));
    assert_ok(prl_store_run_create(db, "demo", config, 1, &run));
    prl_store_prompt p = {.run = run,
                          .prompt_id = "p</script>",
                          .domain = "reasoning",
                          .split = "train",
                          .task = "{}",
                          .difficulty = 0};
    assert_ok(prl_store_prompt_put(db, &p));
    for (int k = steps - 1; k >= 0; k--) {
        char m[128];
        snprintf(m, sizeof m, "{\"reward_mean\": %d, \"trainer\": {\"route_overlap\": [1, 0.5]}}",
                 k);
        prl_store_step st = {.run = run, .step = k, .metrics = m};
        assert_ok(prl_store_step_put(db, &st));
        for (int j = 0; j < per_step; j++) {
            int32_t tokens[6] = {1, 2, 65, 66, 67, 68};
            float lp[4] = {0, -0.25f, -0.5f, -0.75f};
            uint8_t mask[4] = {1, 0, 1, 1};
            prl_store_sample s = {.run = run,
                                  .step = k,
                                  .prompt_id = "p</script>",
                                  .sample_index = j,
                                  .tokens = tokens,
                                  .n_tokens = 6,
                                  .prompt_len = 2,
                                  .logprobs = lp,
                                  .loss_mask = mask,
                                  .version = k,
                                  .worker = "w",
                                  .reward = 0.5,
                                  .reward_detail = "{\"score\": 0.5}"};
            assert_ok(prl_store_sample_put(db, &s, NULL));
        }
    }
    assert_ok(prl_store_event_add(db, run, "join", "{\"role\": \"trainer\"}"));
    assert_ok(prl_store_event_add(db, run, "eval", "{\"version\": 2, \"accuracy\": 0.25}"));
    prl_store_close(db);
}

static json_t *gather(int samples_per_step)
{
    prl_report_options o = prl_report_defaults();
    o.samples_per_step = samples_per_step;
    json_t *doc = NULL;
    assert_ok(prl_report_gather(rundir, &o, &doc));
    return doc;
}

START_TEST(test_grpo_document)
{
    make_run("{\"model\": {\"init\": \"nowhere\"}}", 3, 3);
    json_t *doc = gather(2), *run = json_object_get(doc, "run");
    ck_assert_str_eq(json_string_value(json_object_get(run, "kind")), "grpo");
    ck_assert_str_eq(json_string_value(json_object_get(run, "name")), "demo");
    ck_assert(json_is_null(json_object_get(run, "tokenizer")));
    ck_assert_int_eq(json_integer_value(json_object_get(run, "samples_total")), 9);
    ck_assert_int_eq(json_integer_value(json_object_get(run, "samples_shown")), 6);
    json_t *steps = json_object_get(doc, "steps");
    ck_assert_int_eq(json_array_size(steps), 3);
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(steps, i);
        ck_assert_int_eq(json_integer_value(json_object_get(s, "step")), (json_int_t)i);
        ck_assert_str_eq(json_object_iter_key(json_object_iter(s)), "step");
        ck_assert_int_eq(json_number_value(json_object_get(s, "reward_mean")), (double)i);
    }
    json_t *ev = json_object_get(doc, "events");
    ck_assert_int_eq(json_array_size(ev), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ev, 1), "kind")), "eval");
    ck_assert_int_eq(json_integer_value(json_object_get(
                         json_object_get(json_array_get(ev, 1), "detail"), "version")),
                     2);
    json_t *smp = json_object_get(doc, "samples");
    ck_assert_int_eq(json_array_size(smp), 6);
    json_t *s0 = json_array_get(smp, 0), *s1 = json_array_get(smp, 1);
    ck_assert_int_eq(json_integer_value(json_object_get(s0, "step")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(s1, "sample_index")), 1);
    ck_assert(json_is_null(json_object_get(s0, "prompt")));
    json_t *tok = json_object_get(s0, "tokens"), *ids = json_object_get(s0, "ids");
    ck_assert_int_eq(json_array_size(tok), 4);
    ck_assert_str_eq(json_string_value(json_array_get(tok, 0)), "[65]");
    ck_assert_int_eq(json_integer_value(json_array_get(ids, 3)), 68);
    ck_assert(json_number_value(json_array_get(json_object_get(s0, "logprobs"), 2)) == -0.5);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(s0, "mask"), 1)), 0);
    ck_assert(json_number_value(json_object_get(json_object_get(s0, "detail"), "score")) == 0.5);
    json_decref(doc);
    /* --samples 0: no sample, the count still known */
    doc = gather(0);
    ck_assert_int_eq(json_array_size(json_object_get(doc, "samples")), 0);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(doc, "run"), "samples_total")), 9);
    json_decref(doc);
}
END_TEST

START_TEST(test_tokens_decoded_and_opd)
{
    make_run("{\"opd\": {\"enabled\": true}}", 1, 1);
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/final", rundir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    prl_tokenizer *tok;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    assert_ok(prl_tokenizer_save(tok, path));
    json_t *doc = gather(16), *run = json_object_get(doc, "run");
    ck_assert_str_eq(json_string_value(json_object_get(run, "kind")), "opd");
    ck_assert_str_eq(json_string_value(json_object_get(run, "tokenizer")), path);
    json_t *s0 = json_array_get(json_object_get(doc, "samples"), 0);
    /* the bytes tokenizer: ids 65.. are the bytes after its specials; token i's text is its
    ** bytes, the prompt the decoded text of ids 1, 2 */
    const uint8_t *b;
    size_t len;
    assert_ok(prl_tokenizer_token_bytes(tok, 65, &b, &len));
    char want[16];
    snprintf(want, sizeof want, "%.*s", (int)len, (const char *)b);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(s0, "tokens"), 0)), want);
    ck_assert(json_is_string(json_object_get(s0, "prompt")));
    prl_tokenizer_free(tok);
    json_decref(doc);
}
END_TEST

/* Write `text` to DIR/metrics.jsonl. */
static void write_jsonl(const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", rundir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_sft_document)
{
    write_jsonl("{\"step\": 1, \"loss\": 3.5}\n\n{\"step\": 2, \"loss\": 3.0}\n{\"step\": 3, \"lo");
    json_t *doc = gather(16);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "run"), "kind")),
                     "sft");
    json_t *steps = json_object_get(doc, "steps");
    ck_assert_int_eq(json_array_size(steps), 2); /* the torn tail is skipped */
    ck_assert(json_number_value(json_object_get(json_array_get(steps, 1), "loss")) == 3.0);
    ck_assert_int_eq(json_array_size(json_object_get(doc, "samples")), 0);
    json_decref(doc);

    prl_report_options o = prl_report_defaults();
    write_jsonl("{\"step\": 1, \"loss\": 3.5}\n{\"loss\": 3.0}\n");
    ck_assert_int_eq(prl_report_gather(rundir, &o, &doc), PRL_ERR_FORMAT);
    assert_msg_has("metrics.jsonl:2: not a metrics line with a \"step\"");
    write_jsonl("{\"step\": 1}\nnot json\n{\"step\": 3}\n");
    ck_assert_int_eq(prl_report_gather(rundir, &o, &doc), PRL_ERR_FORMAT);
    assert_msg_has("metrics.jsonl:2:");
    write_jsonl("");
    ck_assert_int_eq(prl_report_gather(rundir, &o, &doc), PRL_ERR_FORMAT);
    assert_msg_has("no metrics lines");
    ck_assert_ptr_null(doc);
}
END_TEST

START_TEST(test_no_run_refused)
{
    prl_report_options o = prl_report_defaults();
    json_t *doc = NULL;
    ck_assert_int_eq(prl_report_gather(rundir, &o, &doc), PRL_ERR_IO);
    assert_msg_has("neither run.db");
    assert_msg_has("nor metrics.jsonl");
    ck_assert_ptr_null(doc);
    /* a run.db without the directory's run */
    ck_assert_int_eq(rmdir(rundir), 0);
    snprintf(rundir, sizeof rundir, "%s/other", tmpdir);
    ck_assert_int_eq(mkdir(rundir, 0755), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/run.db", rundir);
    prl_store *db;
    int64_t run;
    assert_ok(prl_store_open(path, &db));
    assert_ok(prl_store_run_create(db, "demo", "{}", 1, &run));
    prl_store_close(db);
    ck_assert_int_eq(prl_report_gather(rundir, &o, &doc), PRL_ERR_RANGE);
    assert_msg_has("no run 'other'");
}
END_TEST

START_TEST(test_page_inlines_safely)
{
    make_run("{}", 2, 1);
    json_t *doc = gather(16);
    char path[256];
    snprintf(path, sizeof path, "%s/report.html", tmpdir);
    assert_ok(prl_report_write_page(path, doc));
    size_t len;
    char *html = check_read_file(path, &len);
    const char *tag = "<script type=\"application/json\" id=\"prl-data\">";
    char *start = strstr(html, tag);
    ck_assert_ptr_nonnull(start);
    start += strlen(tag);
    char *end = strstr(start, "</script>");
    ck_assert_ptr_nonnull(end);
    json_error_t err;
    json_t *back = json_loadb(start, (size_t)(end - start), 0, &err);
    ck_assert_msg(back != NULL, "the inlined JSON does not parse: %s", err.text);
    ck_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(back, "samples"), 0), "prompt_id")),
                     "p</script>");
    ck_assert(json_equal(json_object_get(back, "steps"), json_object_get(doc, "steps")));
    ck_assert_ptr_nonnull(strstr(html, "Leon Sorokin")); /* uPlot's licence */
    ck_assert_ptr_nonnull(strstr(html, "var uPlot="));
    ck_assert_ptr_nonnull(strstr(html, "page.js"));
    free(html);
    json_decref(back);
    json_decref(doc);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("report");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_grpo_document);
    tcase_add_test(tc, test_tokens_decoded_and_opd);
    tcase_add_test(tc, test_sft_document);
    tcase_add_test(tc, test_no_run_refused);
    tcase_add_test(tc, test_page_inlines_safely);
    suite_add_tcase(s, tc);
    return check_run(s);
}
