/* bias_act's forward against the activation alone and against the kernels of another revision ("old"), at 16M
 * float32 or float16 (HALF=1), 1 thread, out= (a separate y), for the NCHW (64, 64, 4096) dim=1, the transformer
 * (4096, 4096) dim=-1 and (SHORT=1) a short-row (n/256, 64, 4) dim=1 shape; ROWS=16 REPS=20 for 64K in cache.
 * Each round times alone, old, new in turn; the minimum over the rounds is printed.  Built by run.sh. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdint.h>
#include "ma_native.h"
#include "ma_kernel_decls.h"
#include "ma_half.h"
#define OLD(a) extern void old_ma_f32_bias_act_##a##__avx2(void); extern void old_ma_f16_bias_act_##a##__avx2(void);
OLD(relu) OLD(leaky_relu) OLD(gelu) OLD(gelu_tanh) OLD(silu) OLD(sigmoid)

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
typedef void (*ufn)(const void *, void *, size_t, const ma_params *);
typedef void (*bfn)(const void *, const void *, const void *, void *, const ma_bshape *, const ma_params *);
#define E(a, cost, bcost) {#a, (void *)ma_f32_##a##__avx2, (void *)ma_f32_bias_act_##a##__avx2, \
  (void *)ma_f16_##a##__avx2, (void *)ma_f16_bias_act_##a##__avx2, cost, bcost, (void *)old_ma_f32_bias_act_##a##__avx2, (void *)old_ma_f16_bias_act_##a##__avx2}
struct { const char *name; void *u, *b, *uh, *bh; unsigned cost, bcost; void *ob, *obh; } K[] = {
  E(relu, 1, 2), E(leaky_relu, 1, 2), E(gelu, 12, 13), E(gelu_tanh, 8, 9), E(silu, 5, 6), E(sigmoid, 5, 6)};

int main(int argc, char **argv) {
  size_t rows = getenv("ROWS") ? atoi(getenv("ROWS")) : 4096, n = rows * 4096;
  int reps = getenv("REPS") ? atoi(getenv("REPS")) : 1;
  int rounds = argc > 1 ? atoi(argv[1]) : 5;
  const char *only = argc > 2 ? argv[2] : NULL;
  int half = getenv("HALF") != NULL;
  size_t off = getenv("OFF") ? atoi(getenv("OFF")) : 16;
  size_t es = half ? 2 : 4;
  char *xm = aligned_alloc(4096, n * es + 4096), *ym = aligned_alloc(4096, n * es + 4096);
  void *x = xm + off, *y = ym + off;
  float *bf = malloc(4096 * 4); uint16_t *bh = malloc(4096 * 2);
  srand(1);
  for (size_t i = 0; i < n; i++) { float v = (rand() / (float)RAND_MAX - 0.5f) * 6;
    if (half) ((uint16_t *)x)[i] = ma_f2h(v); else ((float *)x)[i] = v; }
  for (int i = 0; i < 4096; i++) { bf[i] = (rand() / (float)RAND_MAX - 0.5f); bh[i] = ma_f2h(bf[i]); }
  memset(ym, 0, n * es + 4096);
  ma_params p; memset(&p, 0, sizeof p); p.a = 0.01f; p.gain = 1.0f; p.clamp = __builtin_inff();
  for (unsigned k = 0; k < sizeof K / sizeof K[0]; k++) {
    if (only && !strstr(only, K[k].name)) continue;
    for (int shape = 0; shape < (getenv("SHORT") ? 3 : 2); shape++) {
      ma_bshape sh = shape == 2 ? (ma_bshape){n / 256, 64, 4, 1, 0, K[k].bcost, 1} : shape == 0 ? (ma_bshape){rows >= 64 ? rows / 64 : 1, rows >= 64 ? 64 : rows, 4096, 1, 0, K[k].bcost, 1} : (ma_bshape){rows, 4096, 1, 1, 0, K[k].bcost, 1};
      double ta = 1e9, tb = 1e9, to = 1e9;
      for (int r = 0; r < rounds; r++) {
        double t = now();
        for (int q = 0; q < reps; q++) ma_run_unary(half ? K[k].uh : K[k].u, x, y, n, es, K[k].cost, p.a, 0, 0, 0, 1);
        t = now() - t; if (t < ta) ta = t;
        t = now();
        for (int q = 0; q < reps; q++) ((bfn)(half ? K[k].bh : K[k].b))(x, half ? (void *)bh : (void *)bf, NULL, y, &sh, &p);
        t = now() - t; if (t < tb) tb = t;
        t = now();
        for (int q = 0; q < reps; q++) ((bfn)(half ? K[k].obh : K[k].ob))(x, half ? (void *)bh : (void *)bf, NULL, y, &sh, &p);
        t = now() - t; if (t < to) to = t;
      }
      printf("%s %-11s %s alone %8.1f us  old bias_act %8.1f us (%.2fx)  new %8.1f us (%.2fx)\n", half ? "f16" : "f32", K[k].name,
             shape == 2 ? "inner4" : shape ? "dim=-1" : "NCHW  ", ta * 1e6 / reps, to * 1e6 / reps, to / ta, tb * 1e6 / reps, tb / ta);
      fflush(stdout);
    }
  }
  return 0;
}
