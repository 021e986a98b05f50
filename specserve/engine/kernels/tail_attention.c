/* Tail attention merged with a flash partial: for each query row r and head h, softmax attention
 * over the row's own key columns cols[r, 0..count[r]) (positions S..t in order), in float32 with a
 * fixed reduction order, merged with the flash kernel's partial over keys [0, S) (output and
 * log-sum-exp). A row's result depends on its query and its keys only, never on other rows: each
 * query vector is one lane of a vector, and the keys its row does not read add exact zeros. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 8
#define MAX_D 256
#define MAX_TAIL 64

/* d elements of a bfloat16 (`bf16`) or float32 array as float32. */
static inline void to_float(const void *src, float *dst, int d, int bf16) {
    if (!bf16) {
        memcpy(dst, src, (size_t)d * sizeof(float));
        return;
    }
    const uint16_t *half = src;
    uint32_t *bits = (uint32_t *)dst;
    for (int c = 0; c < d; c++) bits[c] = (uint32_t)half[c] << 16;
}

/* d float32 values into a bfloat16 (`bf16`, rounded to nearest even, NaN kept a quiet NaN) or
 * float32 array. */
static inline void from_float(const float *src, void *dst, int d, int bf16) {
    if (!bf16) {
        memcpy(dst, src, (size_t)d * sizeof(float));
        return;
    }
    const uint32_t *bits = (const uint32_t *)src;
    uint16_t *half = dst;
    for (int c = 0; c < d; c++) {
        uint32_t x = bits[c];
        uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        half[c] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : rounded);
    }
}

typedef float vf __attribute__((vector_size(LANES * sizeof(float)))); /* one lane a query vector */
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline vf splat(float x) { return (vf){0} + x; }

static inline vf select(vi take, vf yes, vf no) { /* take: -1 or 0 per lane */
    return (vf)(((vi)yes & take) | ((vi)no & ~take));
}

/* exp(x - top) per lane (x <= top; -inf and anything below -87 give 0). */
static inline vf exp_lanes(vf x, vf top) {
    vf y = x - top;
    vi keep = y >= splat(-87.0f);
    y = select(keep, y, splat(-87.0f));
    vf m = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    vf r = y - m * 0.693145751953125f - m * 1.428606765330187045e-06f;
    vf p = splat(1.3981999507e-3f);
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vf scale = (vf)((__builtin_convertvector(m, vi) + 127) << 23);
    return select(keep, p * scale, splat(0.0f));
}

/* exp(x) for x <= 0 (-inf gives 0), as `exp_lanes` computes it. */
static inline float exp_nonpositive(float x) { return exp_lanes(splat(x), splat(0.0f))[0]; }

#define MAX_UNION 256

/* The keys one group of query rows reads: the union of their columns, in column order (for a
 * row, its own columns S..t in position order: a tree's ancestors follow its parents). */
typedef struct {
    int count;
    int32_t column[MAX_UNION];
} Union;

/* `into` = `u` with a row's columns (sorted) added; 0 (and `into` undefined) where the union would
 * outgrow MAX_UNION. */
static int union_add(const Union *u, const int32_t *cols, int count, Union *into) {
    int a = 0, b = 0, n = 0;
    while (a < u->count || b < count) {
        int take_u = b >= count || (a < u->count && u->column[a] <= cols[b]);
        int32_t next = take_u ? u->column[a] : cols[b];
        if (a < u->count && u->column[a] == next) a++;
        if (b < count && cols[b] == next) b++;
        if (n == MAX_UNION) return 0;
        into->column[n++] = next;
    }
    into->count = n;
    return 1;
}

typedef struct {
    const char *q, *k, *v, *fo;
    const float *fl;
    char *out;
    const int32_t *cols, *counts;
    const long *q_stride, *k_stride, *v_stride, *fo_stride, *fl_stride;
    int width, queries, heads, group, d, bf16;
    float scale;
} Args;

/* Scores [U] per lane: q . k over c in order (eight keys at a time: eight independent sums keep
 * both FMA ports busy), -inf where the lane's row does not read the key. */
static void scores(const vf *qt, const float *keys, const vi *keep, int U, int d, float scale,
                   vf *score) {
    int x = 0;
    for (; x + 8 <= U; x += 8) {
        vf s[8] = {{0}};
        const float *k0 = keys + x * d;
        for (int c = 0; c < d; c++)
            for (int j = 0; j < 8; j++) s[j] += qt[c] * k0[j * d + c];
        for (int j = 0; j < 8; j++) score[x + j] = s[j];
    }
    for (; x < U; x++) {
        vf s0 = {0};
        for (int c = 0; c < d; c++) s0 += qt[c] * keys[x * d + c];
        score[x] = s0;
    }
    for (x = 0; x < U; x++) score[x] = select(keep[x], score[x] * scale, splat(-INFINITY));
}

/* One block of up to LANES query vectors (row[l], head[l] of the kv head h's group) over the
 * union `u` of their rows' columns (keys and values converted), each lane keeping only its
 * row's columns, merged with its flash partial into `out`. */
static void lanes(const Args *a, long b, int h, const Union *u, const float *keys,
                  const float *values, const int *row, const int *head, int n) {
    int U = u->count, d = a->d;
    long size = a->bf16 ? 2 : 4;
    vf qt[MAX_D], score[MAX_UNION], acc[MAX_D], top = splat(-INFINITY), total = {0};
    vi keep[MAX_UNION];
    float query[MAX_D];
    memset(qt, 0, sizeof(vf) * d);
    memset(keep, 0, sizeof(vi) * U);
    for (int l = 0; l < n; l++) {
        long i = row[l] % a->queries, hh = (long)h * a->group + head[l];
        to_float(a->q + size * (b * a->q_stride[0] + hh * a->q_stride[1] + i * a->q_stride[2]),
                 query, d, a->bf16);
        for (int c = 0; c < d; c++) qt[c][l] = query[c];
        const int32_t *cols = a->cols + (long)row[l] * a->width;
        for (int j = 0, x = 0; j < a->counts[row[l]]; j++) { /* both in column order */
            while (u->column[x] != cols[j]) x++;
            keep[x][l] = -1;
        }
    }
    scores(qt, keys, keep, U, d, a->scale, score);
    for (int x = 0; x < U; x++) top = select(score[x] > top, score[x], top);
    for (int x = 0; x < U; x++) {
        score[x] = exp_lanes(score[x], top);
        total += score[x];
    }
    for (int c0 = 0; c0 < d; c0 += 8) {
        vf part[8] = {{0}};
        for (int x = 0; x < U; x++)
            for (int c = 0; c < 8; c++) part[c] += score[x] * values[x * d + c0 + c];
        memcpy(acc + c0, part, sizeof(part));
    }
    for (int l = 0; l < n; l++) {
        long i = row[l] % a->queries, at = (long)head[l] * a->queries + i;
        float flash_lse = a->fl[b * a->fl_stride[0] + h * a->fl_stride[1] + at * a->fl_stride[2]];
        float tail_lse = top[l] + logf(total[l]);
        float hi = flash_lse > tail_lse ? flash_lse : tail_lse;
        float wf = exp_nonpositive(flash_lse - hi), wt = exp_nonpositive(tail_lse - hi);
        float norm = 1.0f / (wf + wt), tail_w = wt / total[l];
        float merged[MAX_D], flash[MAX_D];
        for (int c = 0; c < d; c++) merged[c] = tail_w * acc[c][l];
        if (wf > 0.0f) { /* a row without flash keys has no partial to read */
            long fo_at = b * a->fo_stride[0] + h * a->fo_stride[1] + at * a->fo_stride[2];
            to_float(a->fo + size * fo_at, flash, d, a->bf16);
            for (int c = 0; c < d; c++) merged[c] += wf * flash[c];
        }
        for (int c = 0; c < d; c++) merged[c] *= norm;
        long head_at = (b * a->queries + i) * a->heads + (long)h * a->group + head[l];
        from_float(merged, a->out + size * head_at * d, d, a->bf16);
    }
}

/* Batch row b, kv head h, its query rows [from, to): in runs whose union fits, each run in lane
 * blocks. */
static void batch_head(const Args *a, long b, int h, int from, int to) {
    static __thread float keys[MAX_UNION * MAX_D], values[MAX_UNION * MAX_D];
    long size = a->bf16 ? 2 : 4;
    const char *k = a->k + size * (b * a->k_stride[0] + h * a->k_stride[1]);
    const char *v = a->v + size * (b * a->v_stride[0] + h * a->v_stride[1]);
    Union both[2];
    int first = from;
    while (first < to) {
        Union *u = &both[0], *grown = &both[1], *swap;
        u->count = 0;
        int end = first;
        while (end < to) {
            long r = b * a->queries + end;
            if (!union_add(u, a->cols + r * a->width, a->counts[r], grown)) break;
            swap = u, u = grown, grown = swap;
            end++;
        }
        for (int x = 0; x < u->count; x++) {
            to_float(k + size * u->column[x] * a->k_stride[2], keys + x * a->d, a->d, a->bf16);
            to_float(v + size * u->column[x] * a->v_stride[2], values + x * a->d, a->d, a->bf16);
        }
        int row[LANES], head[LANES], n = 0;
        for (int i = first; i < end; i++)
            for (int g = 0; g < a->group; g++) {
                row[n] = b * a->queries + i, head[n] = g, n++;
                if (n == LANES) lanes(a, b, h, u, keys, values, row, head, n), n = 0;
            }
        if (n) lanes(a, b, h, u, keys, values, row, head, n);
        first = end;
    }
}

/* ptrs: q [b, H, q, d], k and v [b, KVH, columns, d], fo [b, KVH, G q (head-major, padded), d] and
 * fl [b, KVH, G q] float32 (the flash partials; lse -inf: no keys), out [b, q, H, d] contiguous,
 * cols [R, width] and counts [R] int32 (a row's columns, in position = column order); elements
 * bfloat16 or float32, the last dimension contiguous. ints: the strides in elements of q, k, v, fo
 * (4 each) and fl (3), then rows R, width, queries q, heads H, kv heads, head dim d, bf16 (1) or
 * float32 (0), threads. Row r: batch row r / q, query r % q. Returns 1 for shapes it does not take. */
int tail_attention(void *const *ptrs, const long *ints, float scale) {
    const long *shape = ints + 19;
    Args a = {ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6], ptrs[7],
              ints, ints + 4, ints + 8, ints + 12, ints + 16, shape[1], shape[2], shape[3],
              shape[3] / shape[4], shape[5], shape[6], scale};
    int batch = shape[0] / shape[2], kv_heads = shape[4], threads = shape[7];
    if (a.d > MAX_D || a.d % LANES || a.width > MAX_TAIL) return 1;
    int chunk = a.group >= 2 * LANES ? 1 : 2 * LANES / a.group; /* rows a task: two lane blocks */
    int chunks = (a.queries + chunk - 1) / chunk;
#pragma omp parallel for collapse(3) schedule(static) num_threads(threads) if (threads > 1)
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < kv_heads; h++)
            for (int j = 0; j < chunks; j++) {
                int to = (j + 1) * chunk < a.queries ? (j + 1) * chunk : a.queries;
                batch_head(&a, b, h, j * chunk, to);
            }
    return 0;
}
