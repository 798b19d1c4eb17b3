/*
** general.c — the General domain: "Write about <topic>." with checkable constraints (case,
** word and sentence counts, repetition, order, required and forbidden words, bullets,
** quotes), and demonstrations that satisfy them by construction.
**
** Difficulty d gives d constraints of distinct, compatible types. A demonstration is laid
** out as a plan — units (sentences or bullets), a word count, words forced into slots —
** then filled with the topic's words and rendered. A deliberate mistake builds the plan of
** one constraint's violation instead (one word too many, the other case, the ordered pair
** swapped, ...), so exactly that constraint fails.
*/
#include "tasks/tasks_int.h"

#include <ctype.h>
#include <string.h>

typedef enum ctype {
    C_CASE,
    C_WORD_COUNT,
    C_SENTENCE_COUNT,
    C_WORD_REPEAT,
    C_INCLUDE,
    C_FORBID,
    C_START,
    C_END,
    C_ORDER,
    C_BULLETS,
    C_QUOTED,
    N_CTYPES
} ctype;

static const char *const ctype_names[N_CTYPES] = {
    "case",  "word_count", "sentence_count", "word_repeat", "include", "forbid",
    "start", "end",        "order",          "bullets",     "quoted"};

enum { REL_EXACTLY, REL_AT_MOST, REL_AT_LEAST };
static const char *const rel_names[] = {"exactly", "at_most", "at_least"};
static const char *const rel_words[] = {"exactly", "at most", "at least"};

enum { BANK = 10, N_TOPICS = 8, N_EXTRA = 10, MAX_CON = 3, MAX_SLOTS = 64, MAX_FORCED = 12 };

typedef struct topic {
    const char *name;
    const char *bank[BANK];
} topic;

static const topic topics[N_TOPICS] = {
    {"cats", {"cats", "fur", "sleep", "soft", "purr", "warm", "milk", "paws", "play", "nap"}},
    {"rain",
     {"rain", "clouds", "wet", "drops", "grey", "cold", "puddles", "falls", "roof", "storm"}},
    {"bread",
     {"bread", "flour", "crust", "bake", "oven", "butter", "salt", "slice", "fresh", "loaf"}},
    {"trees",
     {"trees", "leaves", "roots", "tall", "shade", "birds", "wood", "bark", "grow", "branches"}},
    {"music",
     {"music", "songs", "drums", "notes", "loud", "sing", "dance", "piano", "sound", "beat"}},
    {"the sea", {"sea", "waves", "salt", "fish", "boats", "sand", "deep", "wind", "shore", "tide"}},
    {"winter",
     {"winter", "snow", "ice", "cold", "white", "frost", "scarf", "fire", "dark", "long"}},
    {"books",
     {"books", "pages", "words", "read", "stories", "paper", "ink", "shelf", "quiet", "library"}},
};

/* Words for include / repeat / start / end / order: never in a topic bank. */
static const char *const extra[N_EXTRA] = {"red",   "blue",   "gold", "green", "small",
                                           "happy", "bright", "old",  "new",   "kind"};

typedef struct gcon {
    ctype type;
    int relation; /* word_count */
    int n;        /* word_count, sentence_count, word_repeat, bullets */
    int upper;    /* case */
    const char *word, *word2;
} gcon;

typedef struct gproblem {
    const topic *t;
    int n_con;
    gcon con[MAX_CON];
} gproblem;

/* ---------------------------------------------------------------- problems --------- */

static int has_type(const gproblem *p, ctype t)
{
    for (int i = 0; i < p->n_con; i++)
        if (p->con[i].type == t) return 1;
    return 0;
}

static int compatible(const gproblem *p, ctype t)
{
    if (has_type(p, t)) return 0;
    if (t == C_BULLETS) return !has_type(p, C_SENTENCE_COUNT) && !has_type(p, C_QUOTED);
    if (t == C_SENTENCE_COUNT || t == C_QUOTED) return !has_type(p, C_BULLETS);
    return 1;
}

/* Words forced into the response by the constraints (with one more for a violation). */
static int forced_words(const gproblem *p)
{
    int f = 0;
    for (int i = 0; i < p->n_con; i++) {
        const gcon *c = &p->con[i];
        f += c->type == C_INCLUDE || c->type == C_START || c->type == C_END;
        f += c->type == C_ORDER ? 2 : c->type == C_WORD_REPEAT ? c->n : 0;
    }
    return f;
}

static void sample_problem(prl_rng *r, int difficulty, gproblem *p)
{
    memset(p, 0, sizeof *p);
    p->t = &topics[tasks__range(r, 0, N_TOPICS - 1)];
    while (p->n_con < difficulty) {
        ctype t = (ctype)tasks__range(r, 0, N_CTYPES - 1);
        if (compatible(p, t)) p->con[p->n_con++].type = t;
    }
    int used[N_EXTRA] = {0};
    int units = 2; /* the largest unit count a response may get without a count constraint */
    for (int i = 0; i < p->n_con; i++) {
        gcon *c = &p->con[i];
        const char *words[2];
        for (int w = 0; w < 2; w++) {
            int k;
            do k = (int)tasks__range(r, 0, N_EXTRA - 1);
            while (used[k]);
            used[k] = 1;
            words[w] = extra[k];
        }
        int wordy = c->type == C_WORD_REPEAT || c->type == C_INCLUDE || c->type == C_START ||
                    c->type == C_END || c->type == C_ORDER;
        c->word = wordy ? words[0] : NULL;
        c->word2 = c->type == C_ORDER ? words[1] : NULL;
        if (c->type == C_FORBID) c->word = p->t->bank[tasks__range(r, 1, BANK - 1)];
        if (c->type == C_CASE) c->upper = (int)tasks__range(r, 0, 1);
        if (c->type == C_WORD_REPEAT) c->n = (int)tasks__range(r, 2, 3);
        if (c->type == C_SENTENCE_COUNT) units = c->n = (int)tasks__range(r, 1, 3);
        if (c->type == C_BULLETS) units = c->n = (int)tasks__range(r, 2, 4);
    }
    /* Word counts leave room for every violation: one more unit, one more forced word. */
    int min_words = 3 * (units + 1) > forced_words(p) + 1 ? 3 * (units + 1) : forced_words(p) + 1;
    for (int i = 0; i < p->n_con; i++) {
        gcon *c = &p->con[i];
        if (c->type != C_WORD_COUNT) continue;
        c->relation = (int)tasks__range(r, 0, 2);
        c->n = min_words + (c->relation == REL_AT_MOST ? 2 : c->relation == REL_AT_LEAST) +
               (int)tasks__range(r, 0, 4);
    }
}

static void describe(const gcon *c, tasks__buf *b)
{
    switch (c->type) {
    case C_CASE:
        tasks__buf_printf(b, " Use only %s letters.", c->upper ? "capital" : "lowercase");
        break;
    case C_WORD_COUNT:
        tasks__buf_printf(b, " Use %s %d words.", rel_words[c->relation], c->n);
        break;
    case C_SENTENCE_COUNT:
        tasks__buf_printf(b, " Write exactly %d sentence%s.", c->n, c->n == 1 ? "" : "s");
        break;
    case C_WORD_REPEAT:
        tasks__buf_printf(b, " Use the word %s exactly %d times.", c->word, c->n);
        break;
    case C_INCLUDE: tasks__buf_printf(b, " Include the word %s.", c->word); break;
    case C_FORBID: tasks__buf_printf(b, " Do not use the word %s.", c->word); break;
    case C_START: tasks__buf_printf(b, " Start with the word %s.", c->word); break;
    case C_END: tasks__buf_printf(b, " End with the word %s.", c->word); break;
    case C_ORDER: tasks__buf_printf(b, " Mention %s before %s.", c->word, c->word2); break;
    case C_BULLETS: tasks__buf_printf(b, " Write %d bullet points.", c->n); break;
    case C_QUOTED: tasks__buf_printf(b, " Wrap the answer in double quotes."); break;
    case N_CTYPES: break;
    }
}

static json_t *constraint_json(const gcon *c)
{
    json_t *o = json_pack("{s:s}", "type", ctype_names[c->type]);
    if (!o) return NULL;
    int bad = 0;
    switch (c->type) {
    case C_CASE:
        bad = json_object_set_new(o, "value", json_string(c->upper ? "upper" : "lower"));
        break;
    case C_WORD_COUNT:
        bad = json_object_set_new(o, "relation", json_string(rel_names[c->relation]));
        bad |= json_object_set_new(o, "n", json_integer(c->n));
        break;
    case C_SENTENCE_COUNT:
    case C_BULLETS: bad = json_object_set_new(o, "n", json_integer(c->n)); break;
    case C_WORD_REPEAT:
        bad = json_object_set_new(o, "word", json_string(c->word));
        bad |= json_object_set_new(o, "n", json_integer(c->n));
        break;
    case C_INCLUDE:
    case C_FORBID:
    case C_START:
    case C_END: bad = json_object_set_new(o, "word", json_string(c->word)); break;
    case C_ORDER:
        bad = json_object_set_new(o, "first", json_string(c->word));
        bad |= json_object_set_new(o, "second", json_string(c->word2));
        break;
    case C_QUOTED:
    case N_CTYPES: break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---------------------------------------------------------------- responses -------- */

typedef struct plan {
    int units, bullets, words, quoted;
    int upper, lower;
    const char *first, *last;       /* forced first / last word */
    const char *before, *after;     /* an ordered pair */
    const char *forced[MAX_FORCED]; /* words placed anywhere else */
    int n_forced;
    const char *banned[2 * MAX_CON]; /* never used as filler */
    int n_banned;
} plan;

static void force(plan *pl, const char *w, int times)
{
    for (int i = 0; i < times && pl->n_forced < MAX_FORCED; i++) pl->forced[pl->n_forced++] = w;
}

/* Apply constraint c to the plan: as asked, or (violate) so that c fails. */
static void plan_constraint(plan *pl, const gcon *c, int violate)
{
    if (c->word) pl->banned[pl->n_banned++] = c->word;
    if (c->word2) pl->banned[pl->n_banned++] = c->word2;
    switch (c->type) {
    case C_CASE:
        pl->upper = c->upper != violate;
        pl->lower = !pl->upper;
        break;
    case C_WORD_COUNT: break; /* after the units are known: plan_words */
    case C_SENTENCE_COUNT: pl->units = c->n + violate; break;
    case C_BULLETS:
        pl->units = c->n + violate;
        pl->bullets = 1;
        break;
    case C_WORD_REPEAT: force(pl, c->word, c->n + violate); break;
    case C_INCLUDE: force(pl, c->word, !violate); break;
    case C_FORBID: force(pl, c->word, violate); break;
    case C_START: pl->first = violate ? NULL : c->word; break;
    case C_END: pl->last = violate ? NULL : c->word; break;
    case C_ORDER:
        pl->before = violate ? c->word2 : c->word;
        pl->after = violate ? c->word : c->word2;
        break;
    case C_QUOTED: pl->quoted = !violate; break;
    case N_CTYPES: break;
    }
}

static int plan_min_words(const plan *pl)
{
    int f = pl->n_forced + !!pl->first + !!pl->last + 2 * !!pl->before;
    return 3 * pl->units > f ? 3 * pl->units : f;
}

static void plan_words(plan *pl, const gproblem *p, int violated, prl_rng *r)
{
    int min = plan_min_words(pl);
    pl->words = pl->units * (int)tasks__range(r, 3, 5);
    if (pl->words < min) pl->words = min;
    for (int i = 0; i < p->n_con; i++) {
        const gcon *c = &p->con[i];
        if (c->type != C_WORD_COUNT) continue;
        int v = i == violated, n = c->n;
        if (c->relation == REL_EXACTLY) pl->words = n + v;
        else if (c->relation == REL_AT_MOST)
            pl->words = v ? n + 1 + (int)tasks__range(r, 0, 2) : n - (int)tasks__range(r, 0, 2);
        else pl->words = v ? n - 1 : n + (int)tasks__range(r, 0, 2);
        if (pl->words < min) pl->words = min; /* unreachable: sample_problem leaves room */
    }
}

static int banned(const plan *pl, const char *w)
{
    for (int i = 0; i < pl->n_banned; i++)
        if (!strcmp(pl->banned[i], w)) return 1;
    return 0;
}

/* Fill the slots: fixed first/last, the ordered pair and forced words in random free slots
** (the pair in increasing order), topic words elsewhere. */
static void fill_slots(const plan *pl, const topic *t, prl_rng *r, const char **slot)
{
    int n = pl->words, free_at[MAX_SLOTS], n_free = 0;
    for (int i = 0; i < n; i++) slot[i] = NULL;
    if (pl->first) slot[0] = pl->first;
    if (pl->last) slot[n - 1] = pl->last;
    for (int i = 0; i < n; i++)
        if (!slot[i]) free_at[n_free++] = i;
    for (int i = n_free - 1; i > 0; i--) { /* shuffle the free slots */
        int j = (int)tasks__range(r, 0, i), tmp = free_at[i];
        free_at[i] = free_at[j];
        free_at[j] = tmp;
    }
    int k = 0;
    if (pl->before) {
        int a = free_at[k++], b = free_at[k++];
        slot[a < b ? a : b] = pl->before;
        slot[a < b ? b : a] = pl->after;
    }
    for (int i = 0; i < pl->n_forced; i++) slot[free_at[k++]] = pl->forced[i];
    for (int i = 0; i < n; i++)
        while (!slot[i]) {
            const char *w = t->bank[tasks__range(r, 0, BANK - 1)];
            if (!banned(pl, w)) slot[i] = w;
        }
}

static void render(const plan *pl, const char **slot, tasks__buf *b)
{
    if (pl->quoted) tasks__buf_printf(b, "\"");
    int base = pl->words / pl->units, extra_words = pl->words % pl->units, at = 0;
    for (int u = 0; u < pl->units; u++) {
        if (u) tasks__buf_printf(b, pl->bullets ? "\n" : " ");
        if (pl->bullets) tasks__buf_printf(b, "- ");
        int len = base + (u < extra_words);
        for (int w = 0; w < len; w++, at++) {
            const char *word = slot[at];
            char first = word[0];
            if (w == 0 && !pl->lower) first = (char)toupper((unsigned char)first);
            tasks__buf_printf(b, "%s%c%s", w ? " " : "", first, word + 1);
        }
        tasks__buf_printf(b, ".");
    }
    if (pl->quoted) tasks__buf_printf(b, "\"");
    if (pl->upper && b->s)
        for (char *p = b->s; *p; p++) *p = (char)toupper((unsigned char)*p);
}

/* The response to p; `violated` >= 0 builds the violation of that constraint. */
static prl_status respond(const gproblem *p, int violated, prl_rng *r, tasks__draft *d)
{
    plan pl = {.units = (int)tasks__range(r, 1, 2)};
    for (int i = 0; i < p->n_con; i++) plan_constraint(&pl, &p->con[i], i == violated);
    plan_words(&pl, p, violated, r);
    PRL_ASSERT(pl.words <= MAX_SLOTS && pl.words >= plan_min_words(&pl));
    const char *slot[MAX_SLOTS];
    fill_slots(&pl, p->t, r, slot);
    tasks__buf b = {0};
    render(&pl, slot, &b);
    prl_status rc = b.oom ? prl_error_set(PRL_ERR_NOMEM, "general demo")
                          : tasks__append(d->turns, "assistant", b.s);
    tasks__buf_free(&b);
    return rc;
}

prl_status tasks__general_make(tasks__gen *g, tasks__draft *d)
{
    gproblem p;
    sample_problem(&g->problem, g->difficulty, &p);
    tasks__buf q = {0};
    tasks__buf_printf(&q, "Write about %s.", p.t->name);
    json_t *cons = json_array();
    for (int i = 0; i < p.n_con; i++) {
        describe(&p.con[i], &q);
        if (cons && json_array_append_new(cons, constraint_json(&p.con[i])) != 0) {
            json_decref(cons);
            cons = NULL;
        }
    }
    d->prompt = q.oom ? NULL : tasks__prompt(NULL, q.s);
    tasks__buf_free(&q);
    json_t *bank = json_array();
    for (int i = 0; bank && i < BANK; i++)
        if (json_array_append_new(bank, json_string(p.t->bank[i])) != 0) {
            json_decref(bank);
            bank = NULL;
        }
    d->fields =
        cons && bank ? json_pack("{s:o,s:o}", "constraints", cons, "topic_words", bank) : NULL;
    if (!d->fields) { /* json_pack (only called with both) steals them even when it fails */
        if (!cons) json_decref(bank);
        if (!bank) json_decref(cons);
    }
    if (!d->prompt || !d->fields) return prl_error_set(PRL_ERR_NOMEM, "general problem");
    if (!g->demos) return PRL_OK;
    d->turns = json_array();
    if (!d->turns) return prl_error_set(PRL_ERR_NOMEM, "general demo");
    int violated =
        tasks__chance(&g->demo, g->error_rate) ? (int)tasks__range(&g->demo, 0, p.n_con - 1) : -1;
    d->demo_error = violated < 0 ? "none" : ctype_names[p.con[violated].type];
    return respond(&p, violated, &g->demo, d);
}
