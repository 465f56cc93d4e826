// How long mapping and first-touching host memory takes, with and without MADV_HUGEPAGE, as
// ciuic's host buffers do (kit/src/host_buffer.cpp): anonymous mmap, optional huge-page advice,
// then every page written once by T threads, each its own contiguous piece.
//   cc -O2 -pthread scripts/gpu/thp_probe.c -o /tmp/thp_probe && /tmp/thp_probe GIB THREADS ADVISE
// Prints one JSON line: {"gib":..., "threads":..., "advise":..., "map_touch_s":..., "huge_kib":...,
// "stream_gbps":...} (huge_kib: AnonHugePages of this process after the touch, from
// /proc/self/smaps_rollup; stream_gbps: one read-modify-write pass over the buffer by the same
// threads afterwards, bytes read + written per second: what an optimizer's streaming update sees).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static char* base;
static size_t len, parts;

static void* touch(void* arg) {
  const size_t i = (size_t)arg, piece = (len / parts + 4095) / 4096 * 4096;
  for (size_t off = i * piece; off < len && off < (i + 1) * piece; off += 4096) base[off] = 0;
  return NULL;
}

static void* stream(void* arg) {
  const size_t i = (size_t)arg, piece = (len / parts + 4095) / 4096 * 4096;
  unsigned long* w = (unsigned long*)base;
  const size_t end = (i + 1) * piece < len ? (i + 1) * piece : len;
  for (size_t k = i * piece / 8; k < end / 8; ++k) w[k] = w[k] * 3 + 1;
  return NULL;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc != 4) return fprintf(stderr, "usage: thp_probe GIB THREADS ADVISE(0|1)\n"), 2;
  const double gib = atof(argv[1]);
  parts = (size_t)atoi(argv[2]);
  const int advise = atoi(argv[3]);
  len = (size_t)(gib * 1073741824.0);
  const double t0 = now();
  base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return perror("mmap"), 1;
  if (advise) madvise(base, len, MADV_HUGEPAGE);
  pthread_t th[256];
  for (size_t i = 0; i < parts && i < 256; ++i) pthread_create(&th[i], NULL, touch, (void*)i);
  for (size_t i = 0; i < parts && i < 256; ++i) pthread_join(th[i], NULL);
  const double s = now() - t0;
  const double t1 = now();
  for (size_t i = 0; i < parts && i < 256; ++i) pthread_create(&th[i], NULL, stream, (void*)i);
  for (size_t i = 0; i < parts && i < 256; ++i) pthread_join(th[i], NULL);
  const double gbps = 2.0 * (double)len / (now() - t1) / 1e9;
  long huge = -1;
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "AnonHugePages:", 14) == 0) huge = atol(line + 14);
  if (f) fclose(f);
  printf("{\"gib\": %.1f, \"threads\": %zu, \"advise\": %d, \"map_touch_s\": %.3f, \"huge_kib\": %ld, "
         "\"stream_gbps\": %.1f}\n", gib, parts, advise, s, huge, gbps);
  munmap(base, len);
  return 0;
}
