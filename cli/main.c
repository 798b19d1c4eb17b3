/*
** main.c — the prl command: dispatches to subcommands.
*/
#include "cli/cli.h"
#include "prl_version.h"

#include <string.h>

static const cli_command commands[] = {
    {"init", cmd_init, "write a randomly initialised checkpoint from a model config"},
    {"average", cmd_average,
     "the element-wise mean of checkpoints' weights (same model) as a new checkpoint"},
    {"export", cmd_export,
     "write a checkpoint as a Hugging Face model directory (shards, index, bf16 or f32)"},
    {"sft", cmd_sft, "supervised fine-tuning on chat JSONL (loss on assistant tokens)"},
    {"rm", cmd_rm,
     "reward models: General preference pairs, Bradley-Terry training, scores (rm "
     "pairs|train|score)"},
    {"generate", cmd_generate, "sample completions with the infer path (KV cache, batching)"},
    {"eval", cmd_eval, "held-out accuracy per task domain (infer path + verifiers)"},
    {"score", cmd_score, "per-token log-probs of sequences on the train or infer path"},
    {"diagnose", cmd_diagnose,
     "where the train and infer paths disagree: per-op diffs, routes, log-probs, knob sweep"},
    {"report", cmd_report,
     "one HTML page of a run that opens offline: curves, events, a sample browser"},
    {"tokenizer", cmd_tokenizer, "train, encode with and decode with a byte-level BPE tokenizer"},
    {"tasks", cmd_tasks, "RL task data, SFT demonstrations and answer scoring (4 domains)"},
    {"sandbox", cmd_sandbox,
     "run a program isolated (sandbox exec), show the isolation layers (probe)"},
    {"run", cmd_run, "train a GRPO expert: every role as a process over ZeroMQ, samples in run.db"},
    {"role", cmd_role, "run one role of a run (controller, rollout, reward, trainer)"},
    {"keys", cmd_keys, "CURVE keypairs for roles on other hosts (keys generate --out DIR)"},
    {"bench", cmd_bench,
     "benchmarks: training step and decoding vs PyTorch, sandbox, sync vs async pipeline, "
     "checkpoint loading, the controller (bench "
     "train|decode|sandbox|pipeline|load|gateway|controller)"},
};
enum { N_COMMANDS = sizeof commands / sizeof commands[0] };

static void usage(FILE *out)
{
    fprintf(out, "usage: prl <command> [options]   (prl <command> --help for details)\n\n"
                 "prl is an RL post-training pipeline for mixture-of-experts language models.\n\n"
                 "commands:\n");
    for (int i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n  --version  the version and git commit of this build\n");
    fprintf(out, "\nenvironment: PRL_THREADS (threads), OPENBLAS_CORETYPE (BLAS kernel; prl "
                 "picks one from cpuid when unset)\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) {
        printf("prl %s (git %s)\n", PRL_VERSION, PRL_GIT_COMMIT);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (int i = 0; i < N_COMMANDS; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc, argv);
    char names[512];
    cli_command_names(commands, N_COMMANDS, names, sizeof names);
    fprintf(stderr, "prl: unknown command '%s'%s\n\n", argv[1], cli_did_you_mean(argv[1], names));
    usage(stderr);
    return 2;
}
