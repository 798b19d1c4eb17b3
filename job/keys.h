/*
** keys.h — table-driven configuration files: a table of keys (dotted path, type, field
** offset, range, default, choices) drives defaults, parsing, `--set` overrides, range and
** choice checks and serialisation of a plain C struct. The job config (job.h) and the SFT
** recipe (recipe.h) are two such tables.
**
** A JSON config is an object whose members nest along the dotted paths to any depth
** ("demos": {"agent": {"d1": 500}} sets "demos.agent.d1"). Errors are PRL_ERR_CONFIG naming
** the source and the key: an unknown key (with the nearest known key suggested), a wrong
** type, a value out of range, a string not among its choices, a duplicate key (the JSON is
** read with duplicates rejected). Cross-key rules stay with each table's owner.
**
** Ownership: string fields are malloc'ed and owned by the struct (prl_keys_free).
*/
#ifndef PRL_JOB_KEYS_H
#define PRL_JOB_KEYS_H

#include "engine/engine.h"

#include <stddef.h>

typedef enum prl_key_type {
    PRL_KEY_INT,  /* int */
    PRL_KEY_U64,  /* uint64_t */
    PRL_KEY_REAL, /* double */
    PRL_KEY_BOOL, /* int, 0 or 1 */
    PRL_KEY_STR,  /* char *, owned */
    PRL_KEY_ARGV  /* char *, owned: a JSON array of 0..max non-empty strings, kept as compact
                  ** JSON text (a command line such as ["python3", "reward.py"]) */
} prl_key_type;

typedef struct prl_key_spec {
    const char *path; /* "grpo.clip_high" */
    prl_key_type type;
    size_t offset;       /* of the field in the config struct */
    double min, max;     /* numbers: allowed range (inclusive) */
    const char *def;     /* default, as JSON text */
    const char *choices; /* strings: "a|b|c", or NULL for free text */
} prl_key_spec;

/* The owner's cross-key rules, run after every parse, load and set; may be NULL. */
typedef prl_status (*prl_keys_check_fn)(const void *cfg, const char *source);

typedef struct prl_key_table {
    const prl_key_spec *keys;
    int n;
    size_t size; /* sizeof the config struct */
    prl_keys_check_fn check;
} prl_key_table;

/* Every key of the table at its default (cfg is zeroed first). */
prl_status prl_keys_default(const prl_key_table *t, void *cfg);
/* Free the string fields and zero cfg. */
void prl_keys_free(const prl_key_table *t, void *cfg);
/* Apply a JSON object text over cfg (absent keys keep their values), then t->check; `source`
** names the text in errors. */
prl_status prl_keys_parse(const prl_key_table *t, void *cfg, const char *json_text,
                          const char *source);
/* prl_keys_parse of a file's text (errors name the path). */
prl_status prl_keys_load(const prl_key_table *t, void *cfg, const char *path);
/* One `key=value` override: the value is JSON, or a bare word as a string; then t->check. */
prl_status prl_keys_set(const prl_key_table *t, void *cfg, const char *assignment);
/* The same without t->check: for several overrides checked together once (keys whose
** cross-key rules hold only when all of them are set). */
prl_status prl_keys_assign(const prl_key_table *t, void *cfg, const char *assignment);
/* The whole config as nested JSON text (malloc'd, keys in table order), or NULL. */
char *prl_keys_to_json(const prl_key_table *t, const void *cfg);

#endif /* PRL_JOB_KEYS_H */
