/* hearth-prep: prepares a data set of token records and images for `data.kind: shards`
 * (prep.h, docs/data.md). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prep/prep.h"
#include "shape/version.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

static void usage(FILE *f)
{
    fprintf(f,
        "usage: hearth-prep --model PRESET_OR_PATH --in FILE.jsonl [--in FILE.jsonl]...\n"
        "                   --out DIR [OPTIONS]\n\n"
        "Turns JSONL records {\"tokens\": [ints], \"images\": [\"a.png\", \"b.jpg\"]} into shards\n"
        "that hearth-train reads with data.kind=shards (docs/data.md).  Image paths are\n"
        "relative to their JSONL file; each image stands where the k-th image token of the\n"
        "model is in tokens, and is resized to a multiple of patch*spatial_merge within the\n"
        "pixel bounds (Qwen2-VL's smart_resize, antialiased bilinear filter).\n\n"
        "options:\n"
        "  --model M            model preset name or YAML path (required)\n"
        "  --in FILE            a JSONL input file; repeat for more (required)\n"
        "  --out DIR            output directory, created; must be empty (required)\n"
        "  --shard-records N    records per shard (default %d)\n"
        "  -j, --jobs N         threads (default: one per CPU); the output does not depend\n"
        "                       on it\n"
        "  --min-pixels A       least pixels of a resized image (default %ld)\n"
        "  --max-pixels B       most pixels of a resized image (default %ld)\n"
        "  --pad-token ID       token that pads short records when training (default 0)\n"
        "  -q, --quiet          no progress on stderr\n"
        "  -h, --help           show this help and exit\n"
        "      --version        show the version and exit\n\n"
        "exit status: 0 done, 1 runtime failure (I/O), 2 usage error or bad input.\n",
        PREP_SHARD_RECORDS_DEFAULT, PREP_MIN_PIXELS_DEFAULT, PREP_MAX_PIXELS_DEFAULT);
}

static int usage_error(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "hearth-prep: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nTry 'hearth-prep --help'.\n");
    return EXIT_USAGE;
}

/* An integer option in [lo, hi]. */
static int parse_long(const char *opt, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        char range[64];
        snprintf(range, sizeof range, "%ld..%ld", lo, hi);
        fprintf(stderr, "hearth-prep: %s %s: expected an integer in %s\n", opt, v, range);
        fprintf(stderr, "Try 'hearth-prep --help'.\n");
        return EXIT_USAGE;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv)
{
    enum { O_MODEL = 1000, O_IN, O_OUT, O_SHARD, O_MINPX, O_MAXPX, O_PAD, O_VERSION };
    static const struct option longs[] = {
        { "model", required_argument, NULL, O_MODEL },
        { "in", required_argument, NULL, O_IN },
        { "out", required_argument, NULL, O_OUT },
        { "shard-records", required_argument, NULL, O_SHARD },
        { "jobs", required_argument, NULL, 'j' },
        { "min-pixels", required_argument, NULL, O_MINPX },
        { "max-pixels", required_argument, NULL, O_MAXPX },
        { "pad-token", required_argument, NULL, O_PAD },
        { "quiet", no_argument, NULL, 'q' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, O_VERSION },
        { NULL, 0, NULL, 0 },
    };
    const char *model = NULL;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        fprintf(stderr, "hearth-prep: out of memory\n");
        return EXIT_FAILED;
    }
    prep_opts o = { .inputs = inputs, .progress = stderr };
    long v = 0;
    int rc = 0, c;
    opterr = 0;
    while (!rc && (c = getopt_long(argc, argv, ":j:qh", longs, NULL)) != -1) {
        switch (c) {
        case O_MODEL: model = optarg; break;
        case O_IN: inputs[o.n_inputs++] = optarg; break;
        case O_OUT: o.out_dir = optarg; break;
        case O_SHARD:
            if (!(rc = parse_long("--shard-records", optarg, 1, INT32_MAX, &v)))
                o.shard_records = v;
            break;
        case 'j':
            if (!(rc = parse_long("--jobs", optarg, 1, 4096, &v)))
                o.jobs = (int)v;
            break;
        case O_MINPX:
            if (!(rc = parse_long("--min-pixels", optarg, 1, LONG_MAX, &v)))
                o.min_pixels = v;
            break;
        case O_MAXPX:
            if (!(rc = parse_long("--max-pixels", optarg, 1, LONG_MAX, &v)))
                o.max_pixels = v;
            break;
        case O_PAD:
            if (!(rc = parse_long("--pad-token", optarg, 0, INT32_MAX, &v)))
                o.pad_token_id = (int)v;
            break;
        case 'q': o.progress = NULL; break;
        case 'h':
            usage(stdout);
            free(inputs);
            return EXIT_OK;
        case O_VERSION:
            printf("hearth-prep %s\n", version_release());
            free(inputs);
            return EXIT_OK;
        case ':':
            rc = usage_error("option %s needs a value%s", argv[optind - 1], "");
            break;
        default:
            rc = usage_error("unknown option %s%s", argv[optind - 1], "");
            break;
        }
    }
    if (!rc && optind < argc)
        rc = usage_error("unexpected argument '%s'%s", argv[optind], "");
    if (!rc && (!model || !o.n_inputs || !o.out_dir))
        rc = usage_error("%s is required%s", !model ? "--model" : !o.n_inputs ? "--in" : "--out",
                         "");
    if (rc) {
        free(inputs);
        return rc;
    }
    hearth_err err = { { 0 } };
    model_shape m;
    rc = preset_load(&m, model, &err);
    if (rc)
        herr_prefix(&err, rc, "--model %s", model);
    else
        rc = prep_run(&o, &m, &err);
    free(inputs);
    if (rc) {
        fprintf(stderr, "hearth-prep: %s\n", err.msg);
        return rc == HERR_CONFIG ? EXIT_USAGE : EXIT_FAILED;
    }
    return EXIT_OK;
}
