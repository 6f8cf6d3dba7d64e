/* The job of `generate("1f1b", devices=S, microbatches=M)` + `evaluate(UnitCosts(f, b))`
 * written plainly in C, as the yardstick of bench/bench_limits.py:
 * build every device's 1F1B order (warm-up min(S-d-1, M) forwards, then F/B pairs,
 * then the remaining backwards; Megatron's order), the dependency DAG in CSR
 * (row order; F(s-1,m) -> F(s,m); F(s,m) -> B(s,m); B(s+1,m) -> B(s,m)), and the
 * longest path by Kahn's order. Communication is free, as under UnitCosts.
 *
 *     cc -O2 -o onefoneb onefoneb.c && ./onefoneb S M F B REPEAT
 * prints "makespan best_seconds".
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* op id of (kind, stage, microbatch): forwards first, then backwards */
#define OP(kind, s, m) ((long)(kind) * S * M + (long)(s) * M + (m))

static double run(int S, int M, double f, double b) {
    long n = 2L * S * M;
    int *order = malloc(n * sizeof(int));          /* per-device orders, device-major */
    int *indptr = calloc(n + 1, sizeof(int));
    int *succ = malloc(3 * n * sizeof(int));
    int *indegree = calloc(n, sizeof(int));
    int *queue = malloc(n * sizeof(int));
    double *start = calloc(n, sizeof(double));
    long k = 0;
    for (int d = 0; d < S; d++) {                  /* stage d runs on device d */
        int w = S - d - 1 < M ? S - d - 1 : M;
        for (int m = 0; m < w; m++) order[k++] = OP(0, d, m);
        for (int i = 0; i < M - w; i++) {
            order[k++] = OP(0, d, w + i);
            order[k++] = OP(1, d, i);
        }
        for (int m = M - w; m < M; m++) order[k++] = OP(1, d, m);
    }
    /* successors: at most three per op (next in row, and two data edges) */
    int *next = malloc(n * sizeof(int));
    for (long i = 0; i < n; i++) next[i] = -1;
    for (long i = 0; i + 1 < n; i++)
        if ((i + 1) % (2L * M) != 0) next[order[i]] = order[i + 1];
    for (long v = 0; v < n; v++) {
        int kind = v / ((long)S * M), s = (v / M) % S, m = v % M;
        int count = next[v] >= 0;
        if (kind == 0) count += 1 + (s + 1 < S);
        else count += s > 0;
        indptr[v + 1] = indptr[v] + count;
    }
    for (long v = 0; v < n; v++) {
        int kind = v / ((long)S * M), s = (v / M) % S, m = v % M;
        int e = indptr[v];
        if (next[v] >= 0) succ[e++] = next[v];
        if (kind == 0) {
            succ[e++] = OP(1, s, m);
            if (s + 1 < S) succ[e++] = OP(0, s + 1, m);
        } else if (s > 0) {
            succ[e++] = OP(1, s - 1, m);
        }
    }
    for (long e = 0; e < indptr[n]; e++) indegree[succ[e]]++;
    long head = 0, tail = 0;
    for (long v = 0; v < n; v++) if (!indegree[v]) queue[tail++] = v;
    double makespan = 0;
    while (head < tail) {
        int v = queue[head++];
        double end = start[v] + (v < (long)S * M ? f : b);
        if (end > makespan) makespan = end;
        for (int e = indptr[v]; e < indptr[v + 1]; e++) {
            int u = succ[e];
            if (end > start[u]) start[u] = end;
            if (--indegree[u] == 0) queue[tail++] = u;
        }
    }
    if (tail != n) makespan = -1;   /* a cycle: cannot happen for 1F1B */
    free(order); free(indptr); free(succ); free(indegree); free(queue); free(start); free(next);
    return makespan;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: onefoneb S M F B REPEAT\n");
        return 2;
    }
    int S = atoi(argv[1]), M = atoi(argv[2]), repeat = atoi(argv[5]);
    double f = atof(argv[3]), b = atof(argv[4]), best = 1e30, makespan = 0;
    for (int r = 0; r < repeat; r++) {
        double t = now();
        makespan = run(S, M, f, b);
        t = now() - t;
        if (t < best) best = t;
    }
    printf("%.17g %.9f\n", makespan, best);
    return 0;
}
