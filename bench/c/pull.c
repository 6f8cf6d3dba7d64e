/* A pull pass over a DAG already numbered in topological order: the yardstick of
 * the kernel's pass in bench/bench_limits.py. Reads int32 pred_indptr (n+1),
 * int32 predecessors (e) and float64 durations (n) from one binary file written by
 * the benchmark (n, e as int64 first), and times
 *     start[i] = max(end[p] for p in preds(i)); end[i] = start[i] + duration[i].
 *
 *     cc -O2 -o pull pull.c && ./pull arrays.bin REPEAT
 * prints "makespan best_seconds".
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: pull arrays.bin REPEAT\n");
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    int64_t n, e;
    if (!in || fread(&n, 8, 1, in) != 1 || fread(&e, 8, 1, in) != 1) return 1;
    int32_t *indptr = malloc((n + 1) * 4), *pred = malloc(e * 4);
    double *duration = malloc(n * 8), *start = malloc(n * 8), *end = malloc(n * 8);
    if (fread(indptr, 4, n + 1, in) != (size_t)(n + 1) || fread(pred, 4, e, in) != (size_t)e
        || fread(duration, 8, n, in) != (size_t)n) return 1;
    fclose(in);
    int repeat = atoi(argv[2]);
    double best = 1e30, makespan = 0;
    for (int r = 0; r < repeat; r++) {
        double t = now();
        makespan = 0;
        for (int64_t i = 0; i < n; i++) {
            double begin = 0;
            for (int32_t k = indptr[i]; k < indptr[i + 1]; k++) {
                double x = end[pred[k]];
                begin = x > begin ? x : begin;
            }
            start[i] = begin;
            end[i] = begin + duration[i];
            makespan = end[i] > makespan ? end[i] : makespan;
        }
        t = now() - t;
        if (t < best) best = t;
    }
    printf("%.17g %.9f\n", makespan, best);
    return 0;
}
