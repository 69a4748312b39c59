/* The report of the profiler state serving Halide 22 libraries (halide_profiler.c), printed
 * through halide_print as Halide 22's halide_profiler_report prints it
 * (src/runtime/profiler_common.cpp at abbf7ff983), a faithful subset. Per pipeline that ran:
 * a rule, its name, the summary lines (total time, samples, runs and how many were timed, time
 * per run; the average threads, parallel loops and tasks per run where it ran anything in
 * parallel; heap allocations and peak), then its entries in tree order (each under the entry
 * it is computed inside, drawn with Halide's glyphs) with Halide's columns: time per run and
 * percent, active threads (over the entry's subtree), parallel loops and tasks per run, heap
 * allocations, peak and average memory, recompute ratio; a counter Halide marks approximate
 * has a '<'. Then, where Halide only reads them for its warnings, a second table of each
 * entry's counters of points computed, loads and stores per run. Left out: colours, the notes
 * column and the performance warnings it numbers, and the JSON dump (HL_PROFILER_JSON_OUTPUT).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim_native.h"
#include "profiling/profiler22_report.h"

typedef struct halide22_profiler_func_stats func22;
typedef struct halide22_profiler_pipeline_stats pipeline22;

/* Bit positions in counters_approximated: update_counters' arguments in order. */
enum {
    COUNTER_MEMORY_TOTAL = 0,
    COUNTER_NUM_ALLOCS = 1,
    COUNTER_PARALLEL_LOOPS = 2,
    COUNTER_PARALLEL_TASKS = 3,
    COUNTER_POINTS_COMPUTED = 5,
    COUNTER_SCALAR_LOADS = 6,
    COUNTER_VECTOR_LOADS = 7,
    COUNTER_GATHERS = 8,
    COUNTER_BYTES_LOADED = 9,
    COUNTER_SCALAR_STORES = 10,
    COUNTER_VECTOR_STORES = 11,
    COUNTER_SCATTERS = 12,
    COUNTER_BYTES_STORED = 13
};

static const char RULE[] =
    "--------------------------------------------------------------------------------------------"
    "------------\n";
static const char BAR[] = "\xe2\x94\x82";     /* │, a column separator */
static const char BRANCH[] = "\xe2\x94\x9c";  /* ├ */
static const char LAST[] = "\xe2\x94\x94";    /* └ */

/* --- a line, by visible columns (a glyph is three bytes and one column) -------------------- */

enum { LINE_BYTES = 2048 };
typedef struct {
    char text[LINE_BYTES];
    size_t bytes;
    int columns;
} line;

static void put(line *l, const char *s, size_t n, int columns) {
    if (l->bytes + n + 2 > LINE_BYTES) { /* (room for the newline and NUL kept) */
        return;
    }
    memcpy(l->text + l->bytes, s, n);
    l->bytes += n;
    l->columns += columns;
}

static void text(line *l, const char *s) {
    put(l, s, strlen(s), (int)strlen(s));
}

static void glyph(line *l, const char *g) {
    put(l, g, strlen(g), 1);
}

static void pad_to(line *l, int column) {
    while (l->columns < column && l->bytes + 3 < LINE_BYTES) {
        put(l, " ", 1, 1);
    }
}

/* `s` in `width` columns: cut, or padded on the right (on the left where `right`). */
static void cell(line *l, const char *s, int width, bool right) {
    int n = (int)strlen(s);
    int end = l->columns + width;
    if (right && n < width) {
        pad_to(l, end - n);
    }
    put(l, s, (size_t)(n < width ? n : width), n < width ? n : width);
    pad_to(l, end);
}

static void print_line(void *user_context, line *l) {
    l->text[l->bytes++] = '\n';
    l->text[l->bytes] = 0;
    halide_print(user_context, l->text);
    l->bytes = 0;
    l->columns = 0;
}

/* --- numbers as Halide writes them ---------------------------------------------------------- */

/* x with an SI suffix once it has five digits (10000 -> 10K): Halide's emit_si. */
static void si(char *out, size_t size, uint64_t x, const char *none) {
    static const char *const suffixes[] = {"", "K", "M", "G", "T", "P", "E"};
    int scale = 0;
    while (x >= 10000) {
        scale++;
        x = (x + 499) / 1000;
    }
    snprintf(out, size, "%llu%s", (unsigned long long)x, scale ? suffixes[scale] : none);
}

/* A counter's cell: blank for 0, else right-aligned with its SI suffix (a space for none),
 * '<' before an upper bound: Halide's emit_counter. */
static void counter_cell(line *l, uint64_t x, int width, bool approx) {
    char number[32] = "", shown[40] = "";
    if (x != 0) {
        si(number, sizeof number, x, " ");
        snprintf(shown, sizeof shown, "%s%s", approx ? "<" : "", number);
    }
    cell(l, shown, width, true);
}

/* A counter summed over `runs` calls, per call: a whole number where every call's was the
 * same total, else the average to two places (Halide's emit_normalized_counter). */
static void per_run_cell(line *l, uint64_t x, int runs, int width, bool approx) {
    if (runs <= 0 || x % (uint64_t)runs == 0) {
        counter_cell(l, runs > 0 ? x / (uint64_t)runs : x, width, approx);
        return;
    }
    double value = (double)x / runs;
    if (value >= 10000) {
        counter_cell(l, (uint64_t)value, width, approx);
        return;
    }
    char shown[48];
    snprintf(shown, sizeof shown, "%s%.2f", approx ? "<" : "", value);
    cell(l, shown, width, true);
}

static bool approximate(const func22 *f, int counter) {
    return (f->counters_approximated >> counter) & 1;
}

/* --- the tree ----------------------------------------------------------------------------- */

typedef struct {
    const pipeline22 *p;
    int *order, *depth, count;
    bool *visited, *last;
} tree;

static bool is_allocation(const func22 *f) {
    return f->kind == halide22_profiler_func_kind_allocation;
}

/* Depth first from the children of `parent`: hoisted allocations first (they precede the
 * production they feed), then the rest, in entry order, as Halide orders them. */
static void visit(tree *t, int parent, int depth) {
    const pipeline22 *p = t->p;
    int last = -1, last_allocation = -1;
    for (int i = 0; i < p->num_funcs; i++) {
        if (p->funcs[i].parent == parent && !t->visited[i]) {
            *(is_allocation(&p->funcs[i]) ? &last_allocation : &last) = i;
        }
    }
    last = last >= 0 ? last : last_allocation;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < p->num_funcs; i++) {
            if (p->funcs[i].parent == parent && !t->visited[i] &&
                is_allocation(&p->funcs[i]) == (pass == 0)) {
                t->visited[i] = true;
                t->depth[i] = depth;
                t->last[i] = i == last;
                t->order[t->count++] = i;
                visit(t, i, depth + 1);
            }
        }
    }
}

/* The name cell: two spaces, a column per level above the entry (│ where that ancestor has
 * siblings below it), the entry's connector, its name. */
static void name_cell(line *l, const tree *t, int i, int *lineage, int width) {
    int end = l->columns + width;
    text(l, "  ");
    int depth = t->depth[i];
    for (int k = depth, j = i; k > 0; k--) {
        lineage[k - 1] = j;
        j = t->p->funcs[j].parent;
    }
    for (int k = 0; k + 1 < depth; k++) {
        if (t->last[lineage[k]]) {
            text(l, " ");
        } else {
            glyph(l, BAR);
        }
    }
    if (depth > 0) {
        glyph(l, t->last[i] ? LAST : BRANCH);
    }
    const char *name = t->p->funcs[i].name != NULL ? t->p->funcs[i].name : "";
    size_t room = l->columns < end ? (size_t)(end - l->columns) : 0;
    size_t n = strlen(name);
    put(l, name, n < room ? n : room, (int)(n < room ? n : room));
    pad_to(l, end);
}

/* --- one pipeline --------------------------------------------------------------------------- */

static void summary(void *user_context, const pipeline22 *p, bool serial, uint64_t loops,
                    uint64_t tasks) {
    char text_[1024], peak[32], loops_si[32], tasks_si[32], timed[48] = "";
    double total_ms = (double)p->time / 1e6;
    int time_runs = p->billed_runs ? p->billed_runs : 1;
    if (p->billed_runs != p->runs) {
        snprintf(timed, sizeof timed, " (%d timed)", p->billed_runs);
    }
    si(peak, sizeof peak, p->memory_peak, "");
    int n = snprintf(text_, sizeof text_,
                     "%s%s\n total time: %f ms  samples: %d  runs: %d%s  time per run: %f ms\n",
                     RULE, p->name != NULL ? p->name : "", total_ms, p->samples, p->runs, timed,
                     total_ms / time_runs);
    if (!serial && n > 0 && (size_t)n < sizeof text_) {
        si(loops_si, sizeof loops_si, loops / (uint64_t)p->runs, "");
        si(tasks_si, sizeof tasks_si, tasks / (uint64_t)p->runs, "");
        double threads = (double)p->active_threads_numerator /
                         ((double)p->active_threads_denominator + 1e-10);
        n += snprintf(text_ + n, sizeof text_ - (size_t)n,
                      " average threads used: %f  parallel loops: %s  parallel tasks: %s\n",
                      threads, loops_si, tasks_si);
    }
    if (n > 0 && (size_t)n < sizeof text_) {
        snprintf(text_ + n, sizeof text_ - (size_t)n,
                 " heap allocations: %d  peak heap usage: %s\n", p->num_allocs, peak);
    }
    halide_print(user_context, text_);
}

static void legend(void *user_context, const char *row) {
    line l = {{0}, 0, 0};
    for (const char *c = row; *c; c++) {
        if (*c == '|') {
            glyph(&l, BAR);
        } else {
            put(&l, c, 1, 1);
        }
    }
    print_line(user_context, &l);
}

/* Subtree totals of time and of active threads' samples, by entry. */
typedef struct {
    uint64_t time, threads_numerator, threads_denominator;
} subtree;

static void row(void *user_context, const pipeline22 *p, const tree *t, const subtree *sub,
                int i, int *lineage) {
    const func22 *f = p->funcs + i;
    int runs = p->runs;
    line l = {{0}, 0, 0};
    name_cell(&l, t, i, lineage, 25);
    glyph(&l, BAR);
    if (is_allocation(f)) {
        cell(&l, "   (allocation)", 18, false);
        glyph(&l, BAR);
        cell(&l, "", 7, false);
        glyph(&l, BAR);
        cell(&l, "", 6, false);
        glyph(&l, BAR);
        cell(&l, "", 6, false);
    } else {
        char shown[48];
        double ms = (double)f->time / ((p->billed_runs ? p->billed_runs : 1) * 1e6);
        snprintf(shown, sizeof shown, "%7.2f%s", ms >= 1000 ? ms / 1000 : ms,
                 ms >= 1000 ? "s " : "ms");
        cell(&l, shown, 9, false);
        text(&l, " ");
        int perthousand = p->time ? (int)(1000 * f->time / p->time) : 0;
        snprintf(shown, sizeof shown, "(%s%d.%d%%)", perthousand < 100 ? " " : "",
                 perthousand / 10, perthousand % 10);
        cell(&l, shown, 8, false);
        glyph(&l, BAR);
        if (sub[i].time) {
            snprintf(shown, sizeof shown, "%.2f",
                     (double)sub[i].threads_numerator / ((double)sub[i].threads_denominator + 1e-10));
            cell(&l, shown, 6, true);
        } else {
            cell(&l, "", 6, false);
        }
        text(&l, " ");
        glyph(&l, BAR);
        per_run_cell(&l, f->parallel_loops, runs, 6, approximate(f, COUNTER_PARALLEL_LOOPS));
        glyph(&l, BAR);
        per_run_cell(&l, f->parallel_tasks, runs, 6, approximate(f, COUNTER_PARALLEL_TASKS));
    }
    glyph(&l, BAR);
    per_run_cell(&l, f->num_allocs, runs, 6, approximate(f, COUNTER_NUM_ALLOCS));
    glyph(&l, BAR);
    counter_cell(&l, f->num_allocs ? f->memory_peak : f->stack_peak, 6, false);
    glyph(&l, BAR);
    if (f->num_allocs) {
        counter_cell(&l, f->memory_total / f->num_allocs, 6, approximate(f, COUNTER_MEMORY_TOTAL));
    } else {
        cell(&l, "", 6, false);
    }
    glyph(&l, BAR);
    int canonical = f->canonical_id >= 0 && f->canonical_id < p->num_funcs ? f->canonical_id : i;
    uint64_t at_root = p->funcs[canonical].points_required_at_root;
    if (at_root && !is_allocation(f)) {
        char shown[48];
        snprintf(shown, sizeof shown, "%s%.2f",
                 approximate(f, COUNTER_POINTS_COMPUTED) ? "<" : "",
                 (double)f->points_computed / (double)at_root);
        cell(&l, shown, 8, true);
    } else {
        cell(&l, "", 8, false);
    }
    text(&l, " ");
    glyph(&l, BAR);
    print_line(user_context, &l);
}

static void counters_row(void *user_context, const pipeline22 *p, const tree *t, int i,
                         int *lineage) {
    const func22 *f = p->funcs + i;
    struct {
        uint64_t value;
        int counter;
    } columns[] = {
        {f->points_computed, COUNTER_POINTS_COMPUTED}, {f->scalar_loads, COUNTER_SCALAR_LOADS},
        {f->vector_loads, COUNTER_VECTOR_LOADS},       {f->gathers, COUNTER_GATHERS},
        {f->bytes_loaded, COUNTER_BYTES_LOADED},       {f->scalar_stores, COUNTER_SCALAR_STORES},
        {f->vector_stores, COUNTER_VECTOR_STORES},     {f->scatters, COUNTER_SCATTERS},
        {f->bytes_stored, COUNTER_BYTES_STORED},
    };
    line l = {{0}, 0, 0};
    name_cell(&l, t, i, lineage, 25);
    for (size_t c = 0; c < sizeof columns / sizeof columns[0]; c++) {
        glyph(&l, BAR);
        per_run_cell(&l, columns[c].value, p->runs, 8, approximate(f, columns[c].counter));
    }
    glyph(&l, BAR);
    print_line(user_context, &l);
}

static bool shown(const pipeline22 *p, const func22 *f) {
    if ((f->kind == halide22_profiler_func_kind_overhead ||
         f->kind == halide22_profiler_func_kind_thread_idle) && f->time == 0) {
        return false;
    }
    return !((f->kind == halide22_profiler_func_kind_malloc ||
              f->kind == halide22_profiler_func_kind_free) && p->num_allocs == 0);
}

static bool any_counted(const func22 *f) {
    return f->points_computed || f->scalar_loads || f->vector_loads || f->gathers ||
           f->bytes_loaded || f->scalar_stores || f->vector_stores || f->scatters ||
           f->bytes_stored;
}

static void tables(void *user_context, const pipeline22 *p) {
    int n = p->num_funcs;
    tree t = {p, calloc((size_t)n, sizeof(int)), calloc((size_t)n, sizeof(int)), 0,
              calloc((size_t)n, sizeof(bool)), calloc((size_t)n, sizeof(bool))};
    subtree *sub = calloc((size_t)n, sizeof *sub);
    int *lineage = calloc((size_t)n, sizeof(int));
    if (t.order != NULL && t.depth != NULL && t.visited != NULL && t.last != NULL &&
        sub != NULL && lineage != NULL) {
        visit(&t, -1, 0);
        /* Entries whose parent is none of the pipeline's: at the end, at the root. */
        for (int i = 0; i < n; i++) {
            if (!t.visited[i]) {
                t.depth[i] = 0;
                t.last[i] = true;
                t.order[t.count++] = i;
            }
        }
        for (int k = n - 1; k >= 0; k--) { /* children before their parents */
            int j = t.order[k], parent = p->funcs[j].parent;
            sub[j].time += p->funcs[j].time;
            sub[j].threads_numerator += p->funcs[j].active_threads_numerator;
            sub[j].threads_denominator += p->funcs[j].active_threads_denominator;
            if (parent >= 0 && parent < n) {
                sub[parent].time += sub[j].time;
                sub[parent].threads_numerator += sub[j].threads_numerator;
                sub[parent].threads_denominator += sub[j].threads_denominator;
            }
        }
        legend(user_context, "  name                   | time     percent | active|  parallel   "
                             "| heap | peak | avg  |recompute|");
        legend(user_context, "                         |                  |threads| loops| tasks"
                             "|allocs|  mem |  mem |  ratio  |");
        bool counted = false;
        for (int k = 0; k < n; k++) {
            int i = t.order[k];
            if (shown(p, &p->funcs[i])) {
                row(user_context, p, &t, sub, i, lineage);
                counted |= any_counted(&p->funcs[i]);
            }
        }
        if (counted) {
            legend(user_context, "  name                   | points | scalar | vector |gathers "
                                 "| bytes  | scalar | vector |scatters| bytes  |");
            legend(user_context, "                         |computed| loads  | loads  |        "
                                 "| loaded | stores | stores |        | stored |");
            for (int k = 0; k < n; k++) {
                int i = t.order[k];
                if (shown(p, &p->funcs[i])) {
                    counters_row(user_context, p, &t, i, lineage);
                }
            }
        }
    }
    free(t.order);
    free(t.depth);
    free(t.visited);
    free(t.last);
    free(sub);
    free(lineage);
}

void shim_profiler22_print(void *user_context, const struct halide_profiler_state *state) {
    for (const pipeline22 *p = (const pipeline22 *)state->pipelines; p != NULL; p = p->next) {
        if (p->runs <= 0) {
            continue;
        }
        uint64_t loops = 0, tasks = 0;
        bool listed = p->time || p->memory_total;
        for (int i = 0; i < p->num_funcs; i++) {
            loops += p->funcs[i].parallel_loops;
            tasks += p->funcs[i].parallel_tasks;
            listed |= p->funcs[i].stack_peak != 0;
        }
        summary(user_context, p, loops == 0, loops, tasks);
        if (listed) {
            tables(user_context, p);
        }
    }
}
