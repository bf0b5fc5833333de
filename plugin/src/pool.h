/* Fixed-capacity object pool shared by NCCL's threads without locks.
 * Free objects form a Treiber stack whose head carries a generation tag next to the index
 * (ABA-safe 64-bit CAS); never-used objects are handed out from a bump index, so memory that
 * was never needed is never touched (the arena is anonymous memory: untouched pages cost
 * nothing resident). When the pool is exhausted, get() returns NULL and the caller counts a drop:
 * memory stays bounded whatever the event rate. */
#ifndef C4_PLUGIN_POOL_H
#define C4_PLUGIN_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>

/* Zeroed memory whose pages become resident only when touched (calloc would memset memory
 * recycled by malloc). */
static inline void *c4_zalloc(size_t size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static inline void c4_zfree(void *p, size_t size) {
  if (p != NULL) munmap(p, size);
}

/* Every pooled object starts with this header. */
struct c4_obj {
  _Atomic uint32_t next; /* free-list link: index + 1, 0 = end */
  uint8_t type;          /* enum c4_obj_type, set by the owner on get() */
  _Atomic uint8_t live;  /* 1 while started: lets the background thread scan the arena */
};

struct c4_pool {
  _Atomic uint64_t head; /* generation << 32 | (index + 1) */
  _Atomic uint32_t bump; /* objects ever handed out from the arena */
  uint32_t cap;
  uint32_t size;
  char *mem;
};

static inline int c4_pool_init(struct c4_pool *p, uint32_t cap, uint32_t size) {
  p->mem = c4_zalloc((size_t)cap * size);
  p->cap = cap;
  p->size = size;
  atomic_init(&p->head, 0);
  atomic_init(&p->bump, 0);
  return p->mem ? 0 : -1;
}

static inline void c4_pool_free(struct c4_pool *p) {
  c4_zfree(p->mem, (size_t)p->cap * p->size);
  p->mem = NULL;
}

static inline struct c4_obj *c4_pool_at(const struct c4_pool *p, uint32_t i) {
  return (struct c4_obj *)(p->mem + (size_t)i * p->size);
}

/* Objects [0, used) may be live; scanners stop there. */
static inline uint32_t c4_pool_used(struct c4_pool *p) {
  uint32_t b = atomic_load_explicit(&p->bump, memory_order_acquire);
  return b < p->cap ? b : p->cap;
}

static inline void *c4_pool_get(struct c4_pool *p) {
  uint64_t h = atomic_load_explicit(&p->head, memory_order_acquire);
  while ((uint32_t)h != 0) {
    struct c4_obj *o = c4_pool_at(p, (uint32_t)h - 1);
    uint64_t n = ((h >> 32) + 1) << 32 | atomic_load_explicit(&o->next, memory_order_relaxed);
    if (atomic_compare_exchange_weak_explicit(&p->head, &h, n, memory_order_acq_rel,
                                              memory_order_acquire))
      return o;
  }
  if (atomic_load_explicit(&p->bump, memory_order_relaxed) >= p->cap) return NULL;
  uint32_t i = atomic_fetch_add_explicit(&p->bump, 1, memory_order_acq_rel);
  return i < p->cap ? c4_pool_at(p, i) : NULL;
}

static inline uint32_t c4_pool_index(const struct c4_pool *p, const void *obj) {
  return (uint32_t)(((const char *)obj - p->mem) / p->size);
}

static inline void c4_pool_put(struct c4_pool *p, void *obj) {
  struct c4_obj *o = obj;
  uint32_t idx = c4_pool_index(p, obj) + 1;
  uint64_t h = atomic_load_explicit(&p->head, memory_order_relaxed);
  do {
    atomic_store_explicit(&o->next, (uint32_t)h, memory_order_relaxed);
  } while (!atomic_compare_exchange_weak_explicit(&p->head, &h, ((h >> 32) + 1) << 32 | idx,
                                                  memory_order_acq_rel, memory_order_relaxed));
}

#endif
