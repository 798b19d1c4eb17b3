/*
** engine_client.c — a program outside prl that uses the installed engine (tests/test_install.sh
** builds it with `pkg-config --cflags --libs prl`): it reads a model config, initialises the
** model from a seed, scores a short sequence with the train path and saves a checkpoint, which
** the test compares with `prl init`'s bytes. Usage: engine_client CONFIG SEED OUT_DIR
*/
#include <engine/engine.h>

#include <stdio.h>
#include <stdlib.h>

static int fail(const char *what)
{
    fprintf(stderr, "engine_client: %s: %s\n", what, prl_error_message());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 4) return fprintf(stderr, "usage: engine_client CONFIG SEED OUT_DIR\n"), 2;
    prl_config cfg;
    prl_model m;
    if (prl_blas_init(1)) return fail("blas");
    if (prl_config_load(&cfg, argv[1])) return fail("config");
    if (prl_model_init(&m, &cfg)) return fail("model");
    prl_model_init_weights(&m, strtoull(argv[2], NULL, 10));
    int32_t tokens[8] = {1, 5, 9, 12, 3, 7, 2, 4}, targets[8] = {5, 9, 12, 3, 7, 2, 4, -1};
    int32_t lens[1] = {8};
    float weights[8] = {0}; /* ∂loss/∂logp: −1/7 gives the token-mean cross-entropy */
    for (int i = 0; i < 7; i++) weights[i] = -1.0f / 7;
    prl_batch b = {.B = 1,
                   .T = 8,
                   .tokens = tokens,
                   .targets = targets,
                   .lens = lens,
                   .weights = weights,
                   .temperature = 1};
    prl_forward_stats st;
    if (prl_model_forward(&m, &b, NULL, &st)) return fail("forward");
    printf("engine_client: %zu parameters, loss %.6f\n", m.n_params, st.loss);
    if (prl_checkpoint_save(&m, NULL, NULL, NULL, argv[3])) return fail("save");
    prl_model_free(&m);
    return 0;
}
