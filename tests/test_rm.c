/*
** test_rm.c — Check tests for rm/: the pairs reader and its errors, the General pairs (every
** chosen answer scores 1, every rejected one is what its kind says), Bradley–Terry training of
** a tiny reward model (it learns a pair rule it can see, its checkpoint reloads with the
** score head and scores as it did in training, state.json keeps the held-out accuracy), the
** reward-model check naming the key, and the generative judge: the answer form, a tiny random
** judge's unparseable replies graded 0 without an error, and its template check.
*/
#include "reward/reward.h"
#include "rm/rm.h"
#include "tests/check_util.h"

#include <jansson.h>
#include <unistd.h>

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/prl_test_rm_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(test_pairs_read_errors)
{
    make_dir();
    static const struct {
        const char *text, *msg;
    } bad[] = {
        {"{\"prompt\": \"p\", \"chosen\": \"a\"}\n", ":1: needs a non-empty string \"rejected\""},
        {"\n{\"chosen\": \"a\", \"rejected\": \"b\"}\n", ":2: needs a string \"prompt\""},
        {"{\"prompt\": \"p\", \"messages\": [], \"chosen\": \"a\", \"rejected\": \"b\"}",
         "not both"},
        {"{\"messages\": [], \"chosen\": \"a\", \"rejected\": \"b\"}", "\"messages\" is empty"},
        {"{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"margin\": -1}",
         "\"margin\" must be a number >= 0"},
        {"{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}", "\"chosen\""},
        {"not json", ":1: invalid JSON"},
        {"[1]", "expected a JSON object"},
        {"\n\n", "no pairs"},
    };
    char path[128];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_file(path, bad[i].text);
        prl_rm_pairs ps;
        ck_assert_int_eq(prl_rm_pairs_read(path, &ps), PRL_ERR_FORMAT);
        assert_msg_has(bad[i].msg);
        ck_assert_ptr_null(ps.p);
    }
    write_file(path, "{\"prompt\": \"Say hi.\", \"chosen\": \"hi\", \"rejected\": \"no\", "
                     "\"margin\": 0.5, \"id\": 7}\n{\"messages\": [{\"role\": \"system\", "
                     "\"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"}], "
                     "\"chosen\": \"c\", \"rejected\": \"r\"}\n");
    prl_rm_pairs ps;
    assert_ok(prl_rm_pairs_read(path, &ps));
    ck_assert_int_eq(ps.n, 2);
    ck_assert_str_eq(ps.p[0].msgs[0].role, "user");
    ck_assert_str_eq(ps.p[0].msgs[0].content, "Say hi.");
    ck_assert_double_eq(ps.p[0].margin, 0.5);
    ck_assert_double_eq(ps.p[1].margin, -1); /* none: the run's --margin */
    ck_assert_int_eq((int)ps.p[1].n_msgs, 2);
    ck_assert_str_eq(ps.p[1].rejected, "r");
    prl_rm_pairs_free(&ps);
    ck_assert_int_eq(prl_rm_pairs_read("/nonexistent/p.jsonl", &ps), PRL_ERR_IO);
    check_remove_tree(dir);
}
END_TEST

/* The task of a pair line as the verifier reads it: its prompt and the generator's fields are
** not in the line, so score the answers against the rules that are: a run of 5 words. */
static int word_run(const char *text)
{
    char prev[64] = "", w[64];
    int run = 0, best = 0;
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, " .\"");
        if (n && n < sizeof w) {
            snprintf(w, sizeof w, "%.*s", (int)n, p);
            for (char *q = w; *q; q++) *q = (char)(*q | 0x20);
            run = !strcmp(w, prev) ? run + 1 : 1;
            best = run > best ? run : best;
            snprintf(prev, sizeof prev, "%s", w);
        }
        p += n + (p[n] != 0);
    }
    return best;
}

START_TEST(test_pairs_general)
{
    make_dir();
    char path[128];
    snprintf(path, sizeof path, "%s/g.jsonl", dir);
    FILE *f = fopen(path, "w");
    prl_rm_pairs_options o = {.n = 40, .seed = 3, .split = PRL_SPLIT_TRAIN, .difficulty = 0};
    int written = 0;
    assert_ok(prl_rm_pairs_write(&o, f, &written));
    fclose(f);
    ck_assert_int_ge(written, 4 * 30); /* a few problems' demonstrations can be too short */
    prl_rm_pairs ps;
    assert_ok(prl_rm_pairs_read(path, &ps));
    ck_assert_int_eq(ps.n, written);
    int kinds[4] = {0};
    static const char *const names[4] = {"repeated", "off_topic", "stuffed", "truncated"};
    for (int i = 0; i < ps.n; i++) {
        const prl_rm_pair *p = &ps.p[i];
        const char *kind = json_string_value(json_object_get(p->line, "kind"));
        ck_assert_str_eq(p->msgs[p->n_msgs - 1].role, "user");
        ck_assert_str_ne(p->chosen, p->rejected);
        int k = 0;
        while (k < 4 && strcmp(kind, names[k])) k++;
        ck_assert_int_lt(k, 4);
        kinds[k]++;
        if (k == 0) ck_assert_int_ge(word_run(p->rejected), 5);
        if (k == 3) /* a prefix of the chosen answer, in words */
            ck_assert_msg(!strncmp(p->chosen, p->rejected, strlen(p->rejected)), "%s / %s",
                          p->chosen, p->rejected);
    }
    for (int k = 0; k < 4; k++) ck_assert_int_ge(kinds[k], 30);
    prl_rm_pairs_free(&ps);
    /* the same seed writes the same bytes */
    char again[128];
    snprintf(again, sizeof again, "%s/g2.jsonl", dir);
    f = fopen(again, "w");
    assert_ok(prl_rm_pairs_write(&o, f, &written));
    fclose(f);
    size_t la, lb;
    char *a = check_read_file(path, &la), *b = check_read_file(again, &lb);
    ck_assert(la == lb && !memcmp(a, b, la));
    free(a), free(b);
    check_remove_tree(dir);
}
END_TEST

/* A tiny model (byte tokenizer) of the pair rule "the answer that says yes wins". */
static const char *tiny_config =
    "{\"vocab_size\": 288, \"hidden_size\": 32, \"num_hidden_layers\": 2, "
    "\"num_attention_heads\": 2, \"q_lora_rank\": 16, \"kv_lora_rank\": 16, "
    "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, "
    "\"first_k_dense_replace\": 1, \"intermediate_size\": 64, \"n_routed_experts\": 4, "
    "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 16, \"n_shared_experts\": 1, "
    "\"max_position_embeddings\": 96, \"initializer_range\": 0.05}";

static void write_yes_pairs(const char *path, int n, int offset)
{
    FILE *f = fopen(path, "w");
    for (int i = 0; i < n; i++) {
        const char *yes = (i + offset) % 2 ? "yes it is" : "yes";
        const char *no = (i + offset) % 3 ? "no it is not" : "no";
        fprintf(f, "{\"prompt\": \"Is %d even?\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n",
                i + offset, yes, no);
    }
    fclose(f);
}

START_TEST(test_rm_train_tiny)
{
    make_dir();
    char cfg[128], data[128], eval[128], out[128];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    snprintf(eval, sizeof eval, "%s/eval.jsonl", dir);
    snprintf(out, sizeof out, "%s/rm", dir);
    write_file(cfg, tiny_config);
    write_yes_pairs(data, 64, 0);
    write_yes_pairs(eval, 16, 1000);
    prl_rm_train_options o;
    prl_rm_train_options_default(&o);
    o.data = data, o.eval = eval, o.model = cfg, o.out = out;
    o.steps = 60, o.batch = 8, o.lr = 3e-3, o.max_len = 64;
    prl_rm_train_result res;
    assert_ok(prl_rm_train(&o, &res));
    ck_assert_int_eq(res.n_train, 64);
    ck_assert_int_eq(res.n_eval, 16);
    ck_assert_double_eq(res.eval_accuracy, 1.0);
    ck_assert_double_lt(res.eval_loss, 0.3);
    /* the checkpoint: a reward model that scores as it did in training */
    assert_ok(prl_rm_check(out, "key 'reward.model'"));
    prl_rm *rm;
    assert_ok(prl_rm_open(&rm, out));
    prl_chat_message prompt = {"user", "Is 1001 even?"};
    const char *answers[2] = {"yes it is", "no"};
    double s[2], mean, std;
    assert_ok(prl_rm_score(rm, &prompt, 1, answers, 2, s));
    ck_assert_double_gt(s[0], s[1]);
    prl_rm_calibration(rm, &mean, &std);
    ck_assert(std > 0 && std != 1);
    double one;
    assert_ok(prl_rm_score(rm, &prompt, 1, answers + 1, 1, &one)); /* batch-independent */
    ck_assert_double_eq_tol(one, s[1], 1e-5);
    prl_rm_close(rm);
    char path[160];
    snprintf(path, sizeof path, "%s/state.json", out);
    json_error_t je;
    json_t *st = json_load_file(path, 0, &je);
    json_t *r = json_object_get(json_object_get(st, "run"), "reward_model");
    ck_assert_double_eq(json_number_value(json_object_get(r, "eval_accuracy")), 1.0);
    ck_assert_int_eq(json_integer_value(json_object_get(r, "eval_pairs")), 16);
    json_decref(st);
    snprintf(path, sizeof path, "%s/config.json", out);
    size_t len;
    char *text = check_read_file(path, &len);
    ck_assert_ptr_nonnull(strstr(text, "ForSequenceClassification"));
    ck_assert_ptr_nonnull(strstr(text, "\"num_labels\": 1"));
    free(text);
    /* an existing --out is refused, and nothing is written */
    ck_assert_int_eq(prl_rm_train(&o, &res), PRL_ERR_ARG);
    assert_msg_has("exists");
    check_remove_tree(dir);
}
END_TEST

/* A reward model reads one score per row at the row's length, so packed rows (several
** sequences a row, prl_batch.pos) are refused by name rather than scored at a padding token. */
START_TEST(test_score_head_refuses_packed_rows)
{
    prl_config cfg;
    assert_ok(prl_config_parse(&cfg, tiny_config, "tiny"));
    cfg.score_head = 1;
    prl_model m;
    assert_ok(prl_model_init(&m, &cfg));
    prl_model_init_weights(&m, 1);
    enum { B = 1, T = 8 };
    int32_t tokens[B * T] = {1, 2, 3, 0, 0, 4, 5, 0}, lens[B] = {T};
    int32_t pos[B * T] = {0, 1, 2, -1, -1, 0, 1, -1}, targets[B * T];
    float weights[B * T] = {0}, score_w[B] = {1};
    for (int i = 0; i < B * T; i++) targets[i] = -1;
    prl_batch b = {.tokens = tokens,
                   .lens = lens,
                   .B = B,
                   .T = T,
                   .targets = targets,
                   .weights = weights,
                   .temperature = 1,
                   .score_weights = score_w,
                   .pos = pos};
    float logp[B * T];
    prl_forward_stats st;
    ck_assert_int_eq(prl_model_forward(&m, &b, logp, &st), PRL_ERR_ARG);
    assert_msg_has("packed rows");
    b.pos = NULL; /* the same row unpacked is scored */
    assert_ok(prl_model_forward(&m, &b, logp, &st));
    prl_model_free(&m);
}
END_TEST

/* A checkpoint without the head (a policy) is no reward model: the error names the key. */
START_TEST(test_rm_check_names_key)
{
    make_dir();
    prl_config cfg;
    assert_ok(prl_config_parse(&cfg, tiny_config, "tiny"));
    prl_model m;
    assert_ok(prl_model_init(&m, &cfg));
    prl_model_init_weights(&m, 1);
    prl_tokenizer *tok;
    assert_ok(prl_tokenizer_init_bytes(&tok));
    char ck[128];
    snprintf(ck, sizeof ck, "%s/policy", dir);
    assert_ok(prl_checkpoint_save(&m, NULL, NULL, tok, ck));
    ck_assert_int_eq(prl_rm_check(ck, "key 'reward.model'"), PRL_ERR_CONFIG);
    assert_msg_has("key 'reward.model'");
    assert_msg_has("no score head");
    ck_assert_int_ne(prl_rm_check("/nonexistent", "key 'reward.model'"), PRL_OK);
    assert_msg_has("key 'reward.model'");
    /* the same checkpoint as a judge: its replies have no "Score: N", so they grade 0 */
    assert_ok(prl_judge_check(ck, NULL, "key 'reward.judge'"));
    ck_assert_int_eq(prl_judge_check(ck, "Grade {prompt}", "key 'reward.judge'"), PRL_ERR_CONFIG);
    assert_msg_has("no {answer}");
    prl_judge *j;
    assert_ok(prl_judge_open(&j, ck, NULL, 12));
    int unparsed = 0;
    for (int i = 0; i < 4; i++) {
        double score = -1;
        int parsed = -1;
        char reply[64];
        char answer[32];
        snprintf(answer, sizeof answer, "answer %d", i);
        assert_ok(
            prl_judge_score(j, "Say something.", answer, &score, &parsed, reply, sizeof reply));
        ck_assert(parsed == 0 || parsed == 1);
        if (!parsed) {
            ck_assert_double_eq(score, 0);
            unparsed++;
        } else {
            ck_assert(score >= 0 && score <= 1);
        }
    }
    ck_assert_int_ge(unparsed, 1); /* a random model does not write the form */
    prl_judge_close(j);
    prl_tokenizer_free(tok);
    prl_model_free(&m);
    check_remove_tree(dir);
}
END_TEST

START_TEST(test_judge_parse)
{
    static const struct {
        const char *text;
        int ok, grade;
    } cases[] = {
        {"Score: 7", 1, 7},
        {"Score:10", 1, 10},
        {"It is fine.\nScore: 3.\n", 1, 3},
        {"Score: 2\nScore: 9", 1, 9},
        {"Score: 0", 1, 0},
        {"Score: 11", 0, 0},
        {"Score: seven", 0, 0},
        {"Score: 7/10", 0, 0},
        {"score: 7", 0, 0},
        {"7", 0, 0},
        {"", 0, 0},
        {"Score: 1234", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int g = -1;
        int ok = prl_judge_parse(cases[i].text, &g);
        ck_assert_msg(ok == cases[i].ok, "'%s': %d", cases[i].text, ok);
        if (ok) ck_assert_int_eq(g, cases[i].grade);
    }
}
END_TEST

int main(void)
{
    if (prl_blas_init(1) != PRL_OK) return 1;
    Suite *s = suite_create("rm");
    TCase *tc = tcase_create("rm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_pairs_read_errors);
    tcase_add_test(tc, test_pairs_general);
    tcase_add_test(tc, test_rm_train_tiny);
    tcase_add_test(tc, test_rm_check_names_key);
    tcase_add_test(tc, test_score_head_refuses_packed_rows);
    tcase_add_test(tc, test_judge_parse);
    suite_add_tcase(s, tc);
    return check_run(s);
}
