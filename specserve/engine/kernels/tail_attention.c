/* Tail attention merged with a flash partial: for each query row r and head h, softmax attention
 * over the row's own key columns cols[r, 0..count[r]) (positions S..t in order), folded into the
 * flash kernel's partial over keys [0, S) (output and log-sum-exp) in blocks of BLOCK positions
 * aligned to S, in float32 with a fixed reduction order. A query vector's arithmetic depends on
 * its query, its partial and its keys only: never on the rows beside it, the slot it takes, the
 * chunking or the thread count. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8
#define BLOCK 32
#define MAX_D 256
#define MAX_TAIL 64
#define MAX_SPAN 256 /* columns a run of rows converts at once */
_Static_assert(MAX_TAIL <= MAX_SPAN, "a row's own keys must fit one run's buffer");

typedef float vf __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

static inline vf splat(float x) { return (vf){0} + x; }

static inline vf load(const float *p) {
    vf x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store(float *p, vf x) { memcpy(p, &x, sizeof x); }

static inline vf pick(vi take, vf yes, vf no) { /* take: -1 or 0 per lane */
    return (vf)(((vi)yes & take) | ((vi)no & ~take));
}

/* exp(x - top) per lane (x <= top; -inf and anything below -87 give 0). */
static inline vf exp_lanes(vf x, vf top) {
    vf y = x - top;
    vi keep = y >= splat(-87.0f);
    y = pick(keep, y, splat(-87.0f));
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
    return pick(keep, p * scale, splat(0.0f));
}

/* Lane j: the sum of v[j]'s eight lanes, ((0+1)+(2+3))+((4+5)+(6+7)) for every j. */
static inline vf sum_lanes8(const vf *v) {
    vf a[4], b[2];
    for (int i = 0; i < 4; i++)
        a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(v[2 * i], v[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(b[0], b[1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(b[0], b[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

static inline float max_lanes(vf x) {
    float top = x[0];
    for (int j = 1; j < LANES; j++) top = x[j] > top ? x[j] : top;
    return top;
}

/* The sum of x's lanes in sum_lanes8's order. */
static inline float sum_lanes(vf x) {
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

/* One query vector's running softmax: max, sum of exp, and the unnormalized output [d]. */
typedef struct {
    float top, total;
    float *acc;
} Running;

#define QB 4 /* at most this many query vectors a block pass (they share each key and value load) */
#define INLINE static inline __attribute__((always_inline))

/* acc[s][c0, c0 + m * LANES) = acc * keep[s] + the sum over x < n of w[s][x] * value[x][...], x in
 * order (m and qb constants where inlined: the sums stay in registers). */
INLINE void add_values(float *const *acc, int c0, const float *const *value, const float *w,
                       int n, const float *keep, const int m, const int qb) {
    vf part[QB][LANES];
    for (int s = 0; s < qb; s++)
        for (int j = 0; j < m; j++) part[s][j] = load(acc[s] + c0 + j * LANES) * keep[s];
    for (int x = 0; x < n; x++)
        for (int j = 0; j < m; j++) {
            vf v = load(value[x] + c0 + j * LANES);
            for (int s = 0; s < qb; s++) part[s][j] += w[s * BLOCK + x] * v;
        }
    for (int s = 0; s < qb; s++)
        for (int j = 0; j < m; j++) store(acc[s] + c0 + j * LANES, part[s][j]);
}

/* score[s][g]: query s's scaled q . k of keys g * LANES.. (-inf from key n on). */
INLINE void block_scores(const float *const *query, const float *const *key, int n, int d,
                         float scale, vf score[QB][BLOCK / LANES], const int qb) {
    for (int g = 0; g < BLOCK / LANES; g++) {
        if (g * LANES >= n) {
            for (int s = 0; s < qb; s++) score[s][g] = splat(-INFINITY);
            continue;
        }
        const float *k[LANES];
        for (int j = 0; j < LANES; j++) k[j] = key[g * LANES + j < n ? g * LANES + j : 0];
        vf part[QB][LANES] = {{{0}}};
        for (int c = 0; c < d; c += LANES) {
            vf q[QB];
            for (int s = 0; s < qb; s++) q[s] = load(query[s] + c);
            for (int j = 0; j < LANES; j++) {
                vf kc = load(k[j] + c);
                for (int s = 0; s < qb; s++) part[s][j] += q[s] * kc;
            }
        }
        vi lane = (vi){0, 1, 2, 3, 4, 5, 6, 7} + g * LANES;
        for (int s = 0; s < qb; s++)
            score[s][g] = pick(lane < n, sum_lanes8(part[s]) * scale, splat(-INFINITY));
    }
}

/* Fold one block of n keys / values (rows of d float32) into qb queries' running softmax; the
 * value pass takes eight output vectors at a time for one or two queries, else four (an
 * element's sum runs over the keys in order either way). */
INLINE void attend_block(const float *const *query, const float *const *key,
                         const float *const *value, int n, int d, float scale, Running *const *run,
                         const int qb) {
    vf score[QB][BLOCK / LANES];
    block_scores(query, key, n, d, scale, score, qb);
    float w[QB * BLOCK], keep[QB];
    float *acc[QB];
    for (int s = 0; s < qb; s++) {
        vf top = score[s][0];
        for (int g = 1; g < BLOCK / LANES; g++) top = pick(score[s][g] > top, score[s][g], top);
        float old = run[s]->top, block_top = max_lanes(top);
        float new = block_top > old ? block_top : old;
        keep[s] = exp_lanes(splat(old), splat(new))[0];
        vf total = {0};
        for (int g = 0; g < BLOCK / LANES; g++) {
            vf weight = exp_lanes(score[s][g], splat(new));
            total += weight;
            store(w + s * BLOCK + g * LANES, weight);
        }
        run[s]->top = new;
        run[s]->total = run[s]->total * keep[s] + sum_lanes(total);
        acc[s] = run[s]->acc;
    }
    const int wide = qb <= 2 ? LANES : LANES / 2;
    int c0 = 0;
    for (; c0 + LANES * wide <= d; c0 += LANES * wide)
        add_values(acc, c0, value, w, n, keep, wide, qb);
    for (; c0 < d; c0 += LANES) add_values(acc, c0, value, w, n, keep, 1, qb);
}

#define ATTEND_BLOCK(QUERIES)                                                                      \
    static void attend_block##QUERIES(const float *const *query, const float *const *key,         \
                                      const float *const *value, int n, int d, float scale,       \
                                      Running *const *run) {                                      \
        attend_block(query, key, value, n, d, scale, run, QUERIES);                                \
    }
ATTEND_BLOCK(1)
ATTEND_BLOCK(2)
ATTEND_BLOCK(3)
ATTEND_BLOCK(4)

typedef void (*BlockFn)(const float *const *, const float *const *, const float *const *, int,
                        int, float, Running *const *);

/* Query vectors a block pass for G per row: all of them up to QB, else 4 or 3, whichever leaves
 * fewer spare slots in the last pass (4 on a tie). Example: G 5 -> 3 (passes of 3 and 2+1 spare,
 * not 4 and 1+3 spare). A model's constant, so a row's slots never depend on the rows beside it. */
static int block_queries(int group) {
    if (group <= QB) return group;
    return (3 - group % 3) % 3 < (4 - group % 4) % 4 ? 3 : 4;
}

static const BlockFn BLOCK_FN[QB + 1] = {0, attend_block1, attend_block2, attend_block3,
                                         attend_block4};

/* The count vectors query[0..count) over their shared n keys, block by block, qb at a time; a
 * short last group fills its slots with `spare`, whose state nobody reads. */
static void attend(const float *const *query, Running *run, int count, Running *spare,
                   const float *const *key, const float *const *value, int n, int d,
                   float scale) {
    int qb = block_queries(count);
    for (int first = 0; first < count; first += qb) {
        const float *q[QB];
        Running *slot[QB];
        for (int s = 0; s < qb; s++) {
            int real = first + s < count;
            q[s] = query[real ? first + s : first];
            slot[s] = real ? &run[first + s] : spare;
        }
        for (int start = 0; start < n; start += BLOCK) {
            int m = n - start < BLOCK ? n - start : BLOCK;
            BLOCK_FN[qb](q, key + start, value + start, m, d, scale, slot);
        }
    }
}

/* n rows of d elements (bfloat16 where `bf16`, else float32), row r at src + r * stride
 * elements, as float32 [n, d]. */
static void to_float(const void *src, long stride, int n, int d, int bf16, float *dst) {
    for (int r = 0; r < n; r++) {
        float *row = dst + (long)r * d;
        if (!bf16) {
            memcpy(row, (const float *)src + r * stride, (size_t)d * sizeof(float));
            continue;
        }
        const uint16_t *half = (const uint16_t *)src + r * stride;
        uint32_t *bits = (uint32_t *)row;
        for (int c = 0; c < d; c++) bits[c] = (uint32_t)half[c] << 16;
    }
}

/* d float32 values into bfloat16 (`bf16`: nearest even, NaN kept a quiet NaN) or float32. */
static void from_float(const float *src, void *dst, int d, int bf16) {
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

typedef struct {
    const char *q, *k, *v, *fo;
    const float *fl;
    char *out;
    const int32_t *cols, *counts;
    const long *q_stride, *k_stride, *v_stride, *fo_stride, *fl_stride;
    int width, queries, heads, group, d, bf16;
    float scale;
} Args;

/* Row `row` (batch row b, query i), kv head h: its G query vectors start from their flash
 * partials and fold in its tail keys (float32 rows key[x], value[x], x < its count). */
static void one_row(const Args *a, long b, int h, long row, const float *const *key,
                    const float *const *value) {
    int d = a->d, G = a->group;
    long size = a->bf16 ? 2 : 4, i = row % a->queries;
    const float *query[G];
    float q_rows[G][d], acc[G][d], spare_acc[d];
    Running run[G], spare = {-INFINITY, 0.0f, spare_acc};
    memset(spare_acc, 0, sizeof spare_acc);
    for (int g = 0; g < G; g++) {
        long hh = (long)h * G + g, at = (long)g * a->queries + i;
        to_float(a->q + size * (b * a->q_stride[0] + hh * a->q_stride[1] + i * a->q_stride[2]),
                 0, 1, d, a->bf16, q_rows[g]);
        query[g] = q_rows[g];
        float lse = a->fl[b * a->fl_stride[0] + h * a->fl_stride[1] + at * a->fl_stride[2]];
        run[g] = (Running){lse, 1.0f, acc[g]};
        if (lse == -INFINITY) { /* no keys before S: no partial to read */
            run[g].total = 0.0f;
            memset(acc[g], 0, sizeof(float) * d);
        } else {
            long fo_at = b * a->fo_stride[0] + h * a->fo_stride[1] + at * a->fo_stride[2];
            to_float(a->fo + size * fo_at, 0, 1, d, a->bf16, acc[g]);
        }
    }
    attend(query, run, G, &spare, key, value, a->counts[row], d, a->scale);
    for (int g = 0; g < G; g++) {
        float merged[MAX_D];
        for (int c = 0; c < d; c++) merged[c] = acc[g][c] / run[g].total;
        long head_at = row * a->heads + (long)h * G + g;
        from_float(merged, a->out + size * head_at * d, d, a->bf16);
    }
}

/* Widen [lo, hi] to take `row`'s tail columns. */
static void span_of(const Args *a, long row, int *lo, int *hi) {
    const int32_t *cols = a->cols + row * a->width;
    for (int x = 0; x < a->counts[row]; x++) {
        *lo = cols[x] < *lo ? cols[x] : *lo;
        *hi = cols[x] > *hi ? cols[x] : *hi;
    }
}

/* Batch row b, kv head h, its query rows [from, to): in runs whose tail columns span at most
 * MAX_SPAN, each run's columns converted to float32 once (a row spanning more alone, its own
 * keys gathered). */
static void batch_head(const Args *a, long b, int h, int from, int to) {
    static __thread float keys[MAX_SPAN * MAX_D], values[MAX_SPAN * MAX_D];
    long size = a->bf16 ? 2 : 4, ks = a->k_stride[2], vs = a->v_stride[2];
    int d = a->d;
    const char *k = a->k + size * (b * a->k_stride[0] + h * a->k_stride[1]);
    const char *v = a->v + size * (b * a->v_stride[0] + h * a->v_stride[1]);
    const float *key[MAX_TAIL], *value[MAX_TAIL];
    int first = from;
    while (first < to) {
        int lo = 1 << 30, hi = -1, end = first;
        for (; end < to; end++) {
            int row_lo = lo, row_hi = hi;
            span_of(a, b * a->queries + end, &row_lo, &row_hi);
            if (row_hi - row_lo >= MAX_SPAN) break;
            lo = row_lo, hi = row_hi;
        }
        if (end == first) { /* one row spanning more than MAX_SPAN columns: gather its keys */
            long row = b * a->queries + first;
            const int32_t *cols = a->cols + row * a->width;
            for (int x = 0; x < a->counts[row]; x++) {
                to_float(k + size * cols[x] * ks, 0, 1, d, a->bf16, keys + (long)x * d);
                to_float(v + size * cols[x] * vs, 0, 1, d, a->bf16, values + (long)x * d);
                key[x] = keys + (long)x * d, value[x] = values + (long)x * d;
            }
            one_row(a, b, h, row, key, value);
            first++;
            continue;
        }
        to_float(k + size * lo * ks, ks, hi - lo + 1, d, a->bf16, keys);
        to_float(v + size * lo * vs, vs, hi - lo + 1, d, a->bf16, values);
        for (int i = first; i < end; i++) {
            long row = b * a->queries + i;
            const int32_t *cols = a->cols + row * a->width;
            for (int x = 0; x < a->counts[row]; x++) {
                key[x] = keys + (long)(cols[x] - lo) * d;
                value[x] = values + (long)(cols[x] - lo) * d;
            }
            one_row(a, b, h, row, key, value);
        }
        first = end;
    }
}

/* ptrs: q [b, H, q, d], k and v [b, KVH, columns, d], fo [b, KVH, G q (head-major, padded), d] and
 * fl [b, KVH, G q] float32 (the flash partials; lse -inf: no keys), out [b, q, H, d] contiguous,
 * cols [R, width] and counts [R] int32 (a row's columns, in position order; at least one each);
 * elements bfloat16 or float32, the last dimension contiguous. ints: the strides in elements of
 * q, k, v, fo (4 each) and fl (3), then rows R, width, queries q, heads H, kv heads, head dim d,
 * bf16 (1) or float32 (0), threads. Row r: batch row r / q, query r % q. Returns 1 for shapes it
 * does not take (or a row count outside 1..width). */
int tail_attention(void *const *ptrs, const long *ints, float scale) {
    const long *shape = ints + 19;
    Args a = {ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6], ptrs[7],
              ints, ints + 4, ints + 8, ints + 12, ints + 16, shape[1], shape[2], shape[3],
              shape[3] / shape[4], shape[5], shape[6], scale};
    int batch = shape[0] / shape[2], kv_heads = shape[4], threads = shape[7];
    if (a.d > MAX_D || a.d % LANES || a.width > MAX_TAIL) return 1;
    for (long r = 0; r < shape[0]; r++) /* every row reads at least itself, at most `width` */
        if (a.counts[r] < 1 || a.counts[r] > a.width) return 1;
    int chunk = a.group >= 16 ? 1 : 16 / a.group; /* rows a task */
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
