/*
 * The inner loops of following plans under a clock-switch model and of the switch-aware descent, in C.
 *
 * `Paths` holds a DAG and gives its longest path for given durations (evaluate.longest_path_s); `Core` holds one
 * job's DAG (nodes numbered stage by stage in schedule order), every node's measured options
 * (clocks ascending, time and energy at each) and the switch model; it gives
 *   - `longest(durations)`: the longest path through the DAG (evaluate.longest_path_s);
 *   - `stage_cost(stage, row)`: one stage's planned clocks as the descent judges them
 *     (switch_core.PyCore.stage_cost: switching.followable_stage_clocks, late_begins), keeping the row's
 *     durations as the stage's trial;
 *   - `trial_time(stage)`: the longest path with that trial in place of the stage's current durations;
 *   - `trial_waits(stage, time_s)`: with a waiting power per option (`opt_wait`), the waits' energy with that
 *     trial in place (switch_core.PyCore.trial_waits, switch_core.held_waits_j); 0 without one;
 *   - `follow_row(stage, row)`: one stage row as it will really run (effective clocks, late begins, each
 *     computation's time and energy at its effective clock: following.PointFollower's rows);
 *   - `merged(stage, row, min_run_s)`: the row with its short lowered runs merged (switching.merged_stage_clocks);
 *   - `accept(stage)`: the trial becomes the stage's current durations (and held clocks);
 *   - `scan(stage, row, ...)`: the best of the descent's segment moves of a row (switch_core.PyCore.scan);
 *   - `judge_rows(stage, rows, ...)`: the best of given rows, by energy or by energy per late begin removed
 *     (switch_core.PyCore.judge_rows: the coarse moves and the merge repair).
 * It mirrors the Python code operation for operation (the same sums in the same order, no fused
 * multiply-adds: see setup.py), so both give the same bits; the tests compare them. Optional: without a C
 * compiler `switch_core.PyCore` runs instead.
 *
 * What it saves, measured (the daemon's planning step, `benchmarks/planning_step.py a100_sxm 8 12 0 0.012 0`,
 * with and without the C modules built, same tree, 2-core machine, load 3-8): the switch-aware descent 0.60 s
 * against 16.1 s in switch_core.PyCore (27x), of a step of 0.87 s against 18.4 s; following the frontier
 * (`Paths`) 0.22 s against 0.16 s, within the run-to-run spread under that load.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cshared.h"

typedef struct {
    PyObject_HEAD
    int64_t n, e, num_stages, max_stage;
    int64_t *pred_ptr, *pred_idx, *topo, *stage_ptr, *opt_ptr, *opt_clock;
    double *opt_time, *opt_energy;
    double *opt_wait; /* waiting power (W) while each option's clock is held; NULL: the blocking model */
    double latency_s, lead_s;
    double *current, *trial, *finish, *path_in;
    /* with opt_wait, per node: effective clock, waiting power at it and time at it (current, trial and the plan
     * being judged), and the effective plan's start and finish times */
    int64_t *cur_clock, *trial_clock, *held_clock;
    double *cur_wait, *trial_wait, *held_wait, *cur_ran, *trial_ran, *held_ran, *start, *ran_finish;
    /* per stage work: planned and effective clocks, times at the planned clocks, run starts, late marks */
    int64_t *row, *effective, *run_start, *run_len, *planned_k;
    double *times;
    unsigned char *late;
} Core;

/* Index of node's lowest measured clock at or above `clock`, else its highest (StageOptions.snap_up); the
 * clocks are ascending (bisection). */
static int64_t snap_up(const Core *c, int64_t node, int64_t clock) {
    int64_t low = c->opt_ptr[node], high = c->opt_ptr[node + 1] - 1;
    if (c->opt_clock[high] < clock) return high;
    while (low < high) { /* the first in [low, high] at or above clock */
        int64_t mid = low + (high - low) / 2;
        if (c->opt_clock[mid] >= clock)
            high = mid;
        else
            low = mid + 1;
    }
    return low;
}

/* Index of node's measured clock `clock`, or -1. */
static int64_t exact(const Core *c, int64_t node, int64_t clock) {
    int64_t k = snap_up(c, node, clock);
    return c->opt_clock[k] == clock ? k : -1;
}

/* switching.runs_of over c->row[0..n): run starts and lengths; the number of runs. */
static int64_t runs_of(Core *c, int64_t n) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++)
        if (c->row[i] != c->row[(i - 1 + n) % n]) c->run_start[count++] = i;
    if (count == 0) {
        c->run_start[0] = 0;
        c->run_len[0] = n;
        return n ? 1 : 0;
    }
    for (int64_t k = 0; k < count; k++) {
        int64_t len = (c->run_start[(k + 1) % count] - c->run_start[k]) % n;
        if (len < 0) len += n;
        c->run_len[k] = len ? len : n;
    }
    return count;
}

/* switching._before: how many of run k's first computations have `share` of their time before `acts_s`. */
static int64_t before(const Core *c, int64_t n, int64_t k, double acts_s, double share) {
    double elapsed = 0.0;
    int64_t j = 0;
    for (; j < c->run_len[k]; j++) {
        int64_t i = (c->run_start[k] + j) % n;
        if (elapsed + c->times[i] * share >= acts_s) break;
        elapsed += c->times[i];
    }
    return j;
}

static double run_time(const Core *c, int64_t n, int64_t k) {
    double total = 0.0;
    for (int64_t j = 0; j < c->run_len[k]; j++) total += c->times[(c->run_start[k] + j) % n];
    return total;
}

static double acts_after(const Core *c, double before_s) {
    double x = before_s - c->lead_s;
    return (x > 0.0 ? x : 0.0) + c->latency_s;
}

static void snap_run(Core *c, int64_t first, int64_t n, int64_t k, int64_t from, int64_t to, int64_t clock) {
    for (int64_t j = from; j < to; j++) {
        int64_t i = (c->run_start[k] + j) % n;
        c->effective[i] = c->opt_clock[snap_up(c, first + i, clock)];
    }
}

/* switching.followable_stage_clocks of c->row for the stage whose first node is `first`, into c->effective;
 * c->planned_k gets each computation's planned clock snapped up (an option index), and where there are runs
 * c->times its time there. Returns the number of runs. */
static int64_t followable(Core *c, int64_t first, int64_t n) {
    memcpy(c->effective, c->row, sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) c->planned_k[i] = snap_up(c, first + i, c->row[i]);
    int64_t runs = runs_of(c, n);
    if (runs < 2) return runs;
    for (int64_t i = 0; i < n; i++) c->times[i] = c->opt_time[c->planned_k[i]];
    for (int64_t k = 0; k < runs; k++) {
        int64_t b = (k - 1 + runs) % runs;
        int64_t before_mhz = c->row[c->run_start[b]], own_mhz = c->row[c->run_start[k]];
        if (own_mhz < before_mhz) {
            snap_run(c, first, n, k, 0, before(c, n, k, c->latency_s, 0.5), before_mhz);
            continue;
        }
        double before_s = run_time(c, n, b);
        double acts_s = acts_after(c, before_s);
        double elapsed = 0.0; /* _mostly_after */
        for (int64_t j = 0; j < c->run_len[b]; j++) {
            int64_t i = (c->run_start[b] + j) % n;
            if (elapsed + c->times[i] / 2.0 >= acts_s)
                c->effective[i] = c->opt_clock[snap_up(c, first + i, own_mhz)];
            elapsed += c->times[i];
        }
        snap_run(c, first, n, k, 0, before(c, n, k, acts_s - before_s, 0.5), before_mhz);
    }
    return runs;
}

/* switching.merged_stage_clocks of c->row (the stage's first node `first`, n computations), in place: each
 * lowered run shorter than min_run_s joins the lower of its higher neighbours, shortest (then first) first. */
static void merge_short(Core *c, int64_t first, int64_t n, double min_run_s) {
    for (;;) {
        int64_t runs = runs_of(c, n);
        if (runs < 2) return;
        int64_t best = -1, best_target = 0;
        double best_s = 0.0;
        for (int64_t k = 0; k < runs; k++) {
            int64_t own = c->row[c->run_start[k]];
            int64_t prev = c->row[c->run_start[(k - 1 + runs) % runs]], next = c->row[c->run_start[(k + 1) % runs]];
            int64_t target = prev > own ? prev : -1;
            if (next > own && (target < 0 || next < target)) target = next;
            if (target < 0) continue;
            double run_s = 0.0;
            for (int64_t j = 0; j < c->run_len[k]; j++) {
                int64_t i = (c->run_start[k] + j) % n;
                run_s += c->opt_time[snap_up(c, first + i, c->row[i])];
            }
            if (run_s < min_run_s && (best < 0 || run_s < best_s)) {
                best = k;
                best_s = run_s;
                best_target = target;
            }
        }
        if (best < 0) return;
        for (int64_t j = 0; j < c->run_len[best]; j++) {
            int64_t i = (c->run_start[best] + j) % n;
            c->row[i] = c->opt_clock[snap_up(c, first + i, best_target)];
        }
    }
}

/* switching.late_begins of c->row (runs and times as `followable` left them). */
static int64_t late_begins(Core *c, int64_t n, int64_t runs) {
    if (runs < 2) return 0;
    memset(c->late, 0, (size_t)n);
    for (int64_t k = 0; k < runs; k++) {
        int64_t b = (k - 1 + runs) % runs;
        if (c->row[c->run_start[k]] < c->row[c->run_start[b]]) {
            int64_t upto = before(c, n, k, c->latency_s, 0.0);
            for (int64_t j = 0; j < upto; j++) c->late[(c->run_start[k] + j) % n] = 1;
            continue;
        }
        double before_s = run_time(c, n, b);
        double acts_s = acts_after(c, before_s);
        for (int64_t j = before(c, n, b, acts_s, 0.0); j < c->run_len[b]; j++)
            c->late[(c->run_start[b] + j) % n] = 1;
        int64_t upto = before(c, n, k, acts_s - before_s, 0.0);
        for (int64_t j = 0; j < upto; j++) c->late[(c->run_start[k] + j) % n] = 1;
    }
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += c->late[i];
    return count;
}

/* evaluate.longest_path_s */
static double longest_path(int64_t n, const int64_t *pred_ptr, const int64_t *pred_idx, const int64_t *topo,
                           double *finish, const double *durations) {
    double longest_s = 0.0;
    for (int64_t t = 0; t < n; t++) {
        int64_t v = topo[t];
        double start = 0.0;
        for (int64_t p = pred_ptr[v]; p < pred_ptr[v + 1]; p++)
            if (finish[pred_idx[p]] > start) start = finish[pred_idx[p]];
        finish[v] = start + durations[v];
    }
    for (int64_t v = 0; v < n; v++)
        if (finish[v] > longest_s) longest_s = finish[v];
    return longest_s;
}

static double longest(Core *c, const double *durations) {
    return longest_path(c->n, c->pred_ptr, c->pred_idx, c->topo, c->finish, durations);
}

static int check_stage(const Core *c, long long stage) {
    if (stage < 0 || stage >= c->num_stages) {
        PyErr_Format(PyExc_IndexError, "stage %lld out of range", stage);
        return 0;
    }
    return 1;
}

/* The stage's planned clocks are in c->row: its cost into *energy, *busy, *late and its durations into c->trial.
 * 0 with a KeyError set when a planned or effective clock was not measured. */
/* The option of computation i's planned clock (as `followable` left c->planned_k), or -1 where not measured. */
static int64_t planned_option(const Core *c, int64_t i) {
    int64_t k = c->planned_k[i];
    return c->opt_clock[k] == c->row[i] ? k : -1;
}

/* The option of computation i's effective clock, or -1 where not measured (`planned`: planned_option). */
static int64_t ran_option(const Core *c, int64_t first, int64_t i, int64_t planned) {
    return c->effective[i] == c->row[i] ? planned : exact(c, first + i, c->effective[i]);
}

static int row_cost(Core *c, int64_t stage, double *energy, double *busy, int64_t *late) {
    int64_t first = c->stage_ptr[stage], n = c->stage_ptr[stage + 1] - first;
    int64_t runs = followable(c, first, n);
    *energy = 0.0;
    *busy = 0.0;
    for (int64_t i = 0; i < n; i++) {
        int64_t planned = planned_option(c, i), ran = ran_option(c, first, i, planned);
        if (ran < 0 || planned < 0) {
            PyErr_Format(PyExc_KeyError, "computation %lld of stage %lld has no measured clock %lld", (long long)i,
                         (long long)stage, (long long)(ran < 0 ? c->effective[i] : c->row[i]));
            return 0;
        }
        double ran_s = c->opt_time[ran], planned_s = c->opt_time[planned];
        double duration_s = planned_s > ran_s ? planned_s : ran_s;
        c->trial[first + i] = duration_s;
        *energy += c->opt_energy[ran];
        *busy += ran_s;
        if (c->opt_wait) {
            c->trial_clock[first + i] = c->effective[i];
            c->trial_wait[first + i] = c->opt_wait[ran];
            c->trial_ran[first + i] = ran_s;
        }
    }
    *late = late_begins(c, n, runs);
    return 1;
}

/* A sequence of exactly n numbers into ints (as integers) or, where ints is NULL, into floats. 1; 0 with an
 * exception set when obj is no sequence (TypeError `type_error`) or an item no number; -1 with none set when its
 * length is not n, for the caller to say what it expected. */
static int read_numbers(PyObject *obj, int64_t n, const char *type_error, int64_t *ints, double *floats) {
    PyObject *seq = PySequence_Fast(obj, type_error);
    if (!seq) return 0;
    int ok = PySequence_Fast_GET_SIZE(seq) == n ? 1 : -1;
    for (int64_t i = 0; ok > 0 && i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (ints)
            ints[i] = PyLong_AsLongLong(item);
        else
            floats[i] = PyFloat_AsDouble(item);
        if (PyErr_Occurred()) ok = 0;
    }
    Py_DECREF(seq);
    return ok;
}

/* n clocks of a sequence into out; 0 with an exception set when it is not that. */
static int read_row(PyObject *obj, int64_t n, long long stage, int64_t *out) {
    int ok = read_numbers(obj, n, "row must be a sequence of clocks", out, NULL);
    if (ok < 0) PyErr_Format(PyExc_ValueError, "stage %lld has %lld computations", stage, (long long)n);
    return ok > 0;
}

static PyObject *Core_stage_cost(Core *c, PyObject *args) {
    long long stage;
    PyObject *row_obj;
    if (!PyArg_ParseTuple(args, "LO", &stage, &row_obj) || !check_stage(c, stage)) return NULL;
    if (!read_row(row_obj, c->stage_ptr[stage + 1] - c->stage_ptr[stage], stage, c->row)) return NULL;
    double energy, busy;
    int64_t late;
    if (!row_cost(c, stage, &energy, &busy, &late)) return NULL;
    return Py_BuildValue("(ddL)", energy, busy, (long long)late);
}

/* A list of the n clocks in `clocks`, each the item of `seq` where it equals `same[i]` (so that the rows a
 * frontier keeps share their clock objects), else a new int; NULL with an exception set on failure. */
static PyObject *clock_list(PyObject *seq, const int64_t *clocks, const int64_t *same, int64_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; out && i < n; i++) {
        PyObject *clock = PySequence_Fast_GET_ITEM(seq, (Py_ssize_t)i);
        if (clocks[i] == same[i])
            Py_INCREF(clock);
        else
            clock = PyLong_FromLongLong(clocks[i]);
        if (!clock) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, clock);
    }
    return out;
}

/* A list of n floats; NULL with an exception set on failure. */
static PyObject *float_list(const double *values, int64_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (int64_t i = 0; out && i < n; i++) {
        PyObject *value = PyFloat_FromDouble(values[i]);
        if (!value) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, value);
    }
    return out;
}

/* The row argument of stage `stage` into c->row, and as a fast sequence (a new reference); NULL on error. */
static PyObject *row_argument(Core *c, long long stage, PyObject *row_obj) {
    int64_t n = c->stage_ptr[stage + 1] - c->stage_ptr[stage];
    if (!read_row(row_obj, n, stage, c->row)) return NULL;
    return PySequence_Fast(row_obj, "row must be a sequence of clocks");
}

static PyObject *Core_follow_row(Core *c, PyObject *args) {
    long long stage;
    PyObject *row_obj;
    if (!PyArg_ParseTuple(args, "LO", &stage, &row_obj) || !check_stage(c, stage)) return NULL;
    PyObject *seq = row_argument(c, stage, row_obj);
    if (!seq) return NULL;
    int64_t first = c->stage_ptr[stage], n = c->stage_ptr[stage + 1] - first;
    int64_t runs = followable(c, first, n);
    int64_t late = late_begins(c, n, runs);
    for (int64_t i = 0; i < n; i++) {
        int64_t ran = ran_option(c, first, i, planned_option(c, i));
        if (ran < 0) {
            PyErr_Format(PyExc_KeyError, "computation %lld of stage %lld has no measured clock %lld", (long long)i,
                         (long long)stage, (long long)c->effective[i]);
            Py_DECREF(seq);
            return NULL;
        }
        c->path_in[i] = c->opt_time[ran]; /* path_in and finish: work arrays here */
        c->finish[i] = c->opt_energy[ran];
    }
    PyObject *effective = clock_list(seq, c->effective, c->row, n);
    Py_DECREF(seq);
    PyObject *times = effective ? float_list(c->path_in, n) : NULL;
    PyObject *energies = times ? float_list(c->finish, n) : NULL;
    if (!energies) {
        Py_XDECREF(effective);
        Py_XDECREF(times);
        return NULL;
    }
    return Py_BuildValue("(NLNN)", effective, (long long)late, times, energies);
}

static PyObject *Core_merged(Core *c, PyObject *args) {
    long long stage;
    PyObject *row_obj;
    double min_run_s;
    if (!PyArg_ParseTuple(args, "LOd", &stage, &row_obj, &min_run_s) || !check_stage(c, stage)) return NULL;
    PyObject *seq = row_argument(c, stage, row_obj);
    if (!seq) return NULL;
    int64_t first = c->stage_ptr[stage], n = c->stage_ptr[stage + 1] - first;
    memcpy(c->effective, c->row, sizeof(int64_t) * (size_t)n);
    merge_short(c, first, n, min_run_s);
    PyObject *out = clock_list(seq, c->row, c->effective, n);
    Py_DECREF(seq);
    return out;
}

/* The longest path with the stage's trial durations in place of its current ones. */
static double trial_longest(Core *c, int64_t stage) {
    int64_t first = c->stage_ptr[stage], end = c->stage_ptr[stage + 1];
    memcpy(c->path_in, c->current, sizeof(double) * (size_t)c->n);
    memcpy(c->path_in + first, c->trial + first, sizeof(double) * (size_t)(end - first));
    return longest(c, c->path_in);
}

static PyObject *Core_trial_time(Core *c, PyObject *arg) {
    long long stage = PyLong_AsLongLong(arg);
    if ((stage == -1 && PyErr_Occurred()) || !check_stage(c, stage)) return NULL;
    return PyFloat_FromDouble(trial_longest(c, stage));
}

/* One DAG, numbered stage by stage in schedule order, as held_energy reads it. */
typedef struct {
    int64_t n, num_stages;
    const int64_t *pred_ptr, *pred_idx, *topo, *stage_ptr;
} StagedDag;

/* waiting.held_waits_j: the waits' energy of an iteration of time_s when node v runs ran[v] s holding clock[v]
   (waiting wait[v] W); start and finish are work arrays of n. */
static double held_energy(const StagedDag *d, const int64_t *clock, const double *wait, const double *ran,
                          double *start, double *finish, double time_s, double latency_s) {
    for (int64_t t = 0; t < d->n; t++) {
        int64_t v = d->topo[t];
        double begin = 0.0;
        for (int64_t p = d->pred_ptr[v]; p < d->pred_ptr[v + 1]; p++)
            if (finish[d->pred_idx[p]] > begin) begin = finish[d->pred_idx[p]];
        start[v] = begin;
        finish[v] = begin + ran[v];
    }
    double energy = 0.0;
    for (int64_t s = 0; s < d->num_stages; s++) {
        int64_t lo = d->stage_ptr[s], hi = d->stage_ptr[s + 1];
        for (int64_t node = lo; node < hi; node++) {
            int64_t before = node == lo ? hi - 1 : node - 1;
            double gap = start[node] - finish[before] + (node == lo ? time_s : 0.0);
            gap = gap > 0.0 ? gap : 0.0;
            double waiting_w = wait[node];
            if (clock[node] < clock[before]) {
                double early = latency_s < gap ? latency_s : gap;
                energy += early * wait[before] + (gap - early) * waiting_w;
            } else {
                energy += gap * waiting_w;
            }
        }
    }
    return energy;
}

/* switch_core.held_waits_j with the stage's trial in place (0 without opt_wait). */
static double trial_held(Core *c, int64_t stage, double time_s) {
    if (!c->opt_wait) return 0.0;
    int64_t first = c->stage_ptr[stage], len = c->stage_ptr[stage + 1] - first;
    memcpy(c->held_clock, c->cur_clock, sizeof(int64_t) * (size_t)c->n);
    memcpy(c->held_clock + first, c->trial_clock + first, sizeof(int64_t) * (size_t)len);
    memcpy(c->held_wait, c->cur_wait, sizeof(double) * (size_t)c->n);
    memcpy(c->held_wait + first, c->trial_wait + first, sizeof(double) * (size_t)len);
    memcpy(c->held_ran, c->cur_ran, sizeof(double) * (size_t)c->n);
    memcpy(c->held_ran + first, c->trial_ran + first, sizeof(double) * (size_t)len);
    StagedDag dag = {c->n, c->num_stages, c->pred_ptr, c->pred_idx, c->topo, c->stage_ptr};
    return held_energy(&dag, c->held_clock, c->held_wait, c->held_ran, c->start, c->ran_finish, time_s,
                       c->latency_s);
}

static PyObject *Core_trial_waits(Core *c, PyObject *args) {
    long long stage;
    double time_s;
    if (!PyArg_ParseTuple(args, "Ld", &stage, &time_s) || !check_stage(c, stage)) return NULL;
    return PyFloat_FromDouble(trial_held(c, stage, time_s));
}

/* Rows of n clocks seen by a scan (open addressing over an arena): switch_search's duplicate check. */
typedef struct {
    int64_t n, cap, count, limit;
    int64_t *slots; /* -1: empty; else the row's index in rows */
    int64_t *rows;
} RowSet;

static uint64_t row_hash(const int64_t *row, int64_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint64_t)row[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static int rowset_init(RowSet *set, int64_t n, int64_t limit) {
    set->n = n;
    set->limit = limit;
    set->count = 0;
    set->cap = 16;
    while (set->cap < 2 * limit) set->cap *= 2;
    set->slots = malloc(sizeof(int64_t) * (size_t)set->cap);
    set->rows = malloc(sizeof(int64_t) * (size_t)(limit * (n > 0 ? n : 1)));
    if (!set->slots || !set->rows) return 0;
    memset(set->slots, 0xff, sizeof(int64_t) * (size_t)set->cap);
    return 1;
}

/* The slot of `row`: *present says whether it is in the set (else the slot is where it goes). */
static int64_t rowset_slot(const RowSet *set, const int64_t *row, int *present) {
    int64_t mask = set->cap - 1;
    for (int64_t i = (int64_t)(row_hash(row, set->n) & (uint64_t)mask);; i = (i + 1) & mask) {
        int64_t k = set->slots[i];
        if (k < 0 || !memcmp(set->rows + k * set->n, row, sizeof(int64_t) * (size_t)set->n)) {
            *present = k >= 0;
            return i;
        }
    }
}

static void rowset_put(RowSet *set, int64_t slot, const int64_t *row) {
    memcpy(set->rows + set->count * set->n, row, sizeof(int64_t) * (size_t)set->n);
    set->slots[slot] = set->count++;
}

static int cmp_clock(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The stage's measured clocks, ascending, each once (StageOptions.all_clocks_mhz) into out; their number. */
static int64_t stage_clocks(const Core *c, int64_t stage, int64_t *out) {
    int64_t count = 0;
    for (int64_t v = c->stage_ptr[stage]; v < c->stage_ptr[stage + 1]; v++)
        for (int64_t k = c->opt_ptr[v]; k < c->opt_ptr[v + 1]; k++) out[count++] = c->opt_clock[k];
    qsort(out, (size_t)count, sizeof(int64_t), cmp_clock);
    int64_t unique = 0;
    for (int64_t i = 0; i < count; i++)
        if (!unique || out[i] != out[unique - 1]) out[unique++] = out[i];
    return unique;
}

/* What one stage's scan needs besides the row (PyCore.scan's arguments). */
typedef struct {
    int64_t late, late_others, allowed, remaining, num_stages, n_after;
    int repairing, per_late;
    double limit_s, bound_j, energy_before, busy_before, p_block_w, energy_now, late_price_j;
    double *after_e, *after_b;
} ScanArgs;

typedef struct {
    int64_t used;
    int exhausted, found;
    double energy_j, time_s, cost_e, cost_b;
    int64_t cost_late;
    int64_t *row;
} ScanBest;

/* Whether a trial with `trial_late` late begins in all is judged at all (PyCore._judge). */
static int admitted(const ScanArgs *a, int64_t trial_late) {
    if (a->per_late) return trial_late < a->late;
    return a->repairing ? trial_late < a->late : trial_late <= a->allowed;
}

/* Judge one trial row (in c->row): 0 on error; sets best when it beats the bound (its energy, or with
   per_late the energy it adds per late begin it removes). */
static int judge(Core *c, int64_t stage, const ScanArgs *a, double *bound, ScanBest *best, int64_t n) {
    double e, b;
    int64_t late;
    if (!row_cost(c, stage, &e, &b, &late)) return 0;
    int64_t trial_late = a->late_others + late;
    if (!admitted(a, trial_late)) return 1;
    double time_s = trial_longest(c, stage);
    double energy = a->energy_before + e, busy = a->busy_before + b;
    for (int64_t j = 0; j < a->n_after; j++) {
        energy += a->after_e[j];
        busy += a->after_b[j];
    }
    if (c->opt_wait)
        energy += trial_held(c, stage, time_s);
    else
        energy += a->p_block_w * ((double)a->num_stages * time_s - busy);
    double key = a->per_late ? (energy - a->energy_now) / (double)(a->late - trial_late)
                             : energy + a->late_price_j * (double)trial_late;
    if (time_s <= a->limit_s && (a->per_late ? key < *bound : key < *bound - 1e-12)) {
        *bound = key;
        best->found = 1;
        best->energy_j = energy;
        best->time_s = time_s;
        best->cost_e = e;
        best->cost_b = b;
        best->cost_late = late;
        memcpy(best->row, c->row, sizeof(int64_t) * (size_t)n);
    }
    return 1;
}

/* switch_search's moves of one stage, in PyCore.scan's order, each distinct row judged once. 0 on error. */
static int scan_moves(Core *c, int64_t stage, const int64_t *base, const ScanArgs *a, RowSet *set, ScanBest *best,
                      int64_t *clocks, int64_t *snapped, int64_t *trial) {
    int64_t first_node = c->stage_ptr[stage], n = c->stage_ptr[stage + 1] - first_node;
    double bound = a->bound_j;
    int present;
    rowset_put(set, rowset_slot(set, base, &present), base);
    int64_t count = stage_clocks(c, stage, clocks);
    for (int64_t ci = 0; ci < count; ci++) {
        for (int64_t k = 0; k < n; k++) snapped[k] = c->opt_clock[snap_up(c, first_node + k, clocks[ci])];
        for (int64_t first = 0; first < n; first++) {
            memcpy(trial, base, sizeof(int64_t) * (size_t)n);
            for (int64_t length = 0; length < n; length++) {
                int64_t k = (first + length) % n;
                trial[k] = snapped[k];
                int64_t slot = rowset_slot(set, trial, &present);
                if (present) continue;
                if (best->used >= a->remaining || set->count >= set->limit) {
                    best->exhausted = 1;
                    return 1;
                }
                rowset_put(set, slot, trial);
                best->used++;
                memcpy(c->row, trial, sizeof(int64_t) * (size_t)n);
                if (!judge(c, stage, a, &bound, best, n)) return 0;
            }
        }
    }
    return 1;
}

/* The stages after the scanned one, (energy, busy) each, into e and b (room for `capacity`). */
static int read_after(PyObject *obj, ScanArgs *a, double *e, double *b, int64_t capacity) {
    PyObject *seq = PySequence_Fast(obj, "after must be a sequence of (energy, busy) pairs");
    if (!seq) return 0;
    a->n_after = PySequence_Fast_GET_SIZE(seq);
    if (a->n_after > capacity) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "after: more stages than follow this one");
        return 0;
    }
    for (int64_t j = 0; j < a->n_after; j++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "dd", &e[j], &b[j])) {
            Py_DECREF(seq);
            return 0;
        }
    }
    Py_DECREF(seq);
    a->after_e = e;
    a->after_b = b;
    return 1;
}

static PyObject *scan_result(const ScanBest *best, int64_t n) {
    if (!best->found) return Py_BuildValue("(LiO)", (long long)best->used, best->exhausted, Py_None);
    PyObject *row = PyTuple_New(n);
    if (!row) return NULL;
    for (int64_t i = 0; i < n; i++) {
        PyObject *clock = PyLong_FromLongLong(best->row[i]);
        if (!clock) {
            Py_DECREF(row);
            return NULL;
        }
        PyTuple_SET_ITEM(row, i, clock);
    }
    return Py_BuildValue("(Li(ddN(ddL)))", (long long)best->used, best->exhausted, best->energy_j, best->time_s, row,
                         best->cost_e, best->cost_b, (long long)best->cost_late);
}

static PyObject *Core_scan(Core *c, PyObject *args) {
    long long stage, late, late_others, allowed, num_stages, remaining;
    int repairing;
    PyObject *row_obj, *after_obj;
    ScanArgs a = {0};
    if (!PyArg_ParseTuple(args, "LOLLLpddddOdLL|d", &stage, &row_obj, &late, &late_others, &allowed, &repairing,
                          &a.limit_s, &a.bound_j, &a.energy_before, &a.busy_before, &after_obj, &a.p_block_w,
                          &num_stages, &remaining, &a.late_price_j) ||
        !check_stage(c, stage))
        return NULL;
    a.late = late, a.late_others = late_others, a.allowed = allowed, a.repairing = repairing;
    a.num_stages = num_stages, a.remaining = remaining > 0 ? remaining : 0;
    int64_t first = c->stage_ptr[stage], n = c->stage_ptr[stage + 1] - first;
    int64_t options = c->opt_ptr[c->stage_ptr[stage + 1]] - c->opt_ptr[first];
    int64_t possible = options * n * n + 1, limit = (a.remaining < possible ? a.remaining : possible) + 1;
    int64_t *base = zalloc(n, 8), *clocks = zalloc(options, 8), *snapped = zalloc(n, 8), *trial = zalloc(n, 8);
    double *after_e = zalloc(c->num_stages, 8), *after_b = zalloc(c->num_stages, 8);
    ScanBest best = {0};
    best.row = zalloc(n, 8);
    RowSet set = {0};
    PyObject *result = NULL;
    if (!(base && clocks && snapped && trial && after_e && after_b && best.row && rowset_init(&set, n, limit)))
        PyErr_NoMemory();
    else if (read_row(row_obj, n, stage, base) &&
             read_after(after_obj, &a, after_e, after_b, c->num_stages - 1 - (int64_t)stage) &&
             scan_moves(c, stage, base, &a, &set, &best, clocks, snapped, trial))
        result = scan_result(&best, n);
    void *blocks[] = {base, clocks, snapped, trial, after_e, after_b, best.row, set.slots, set.rows};
    free_blocks(blocks, COUNT_OF(blocks));
    return result;
}

/* Judge each row of a sequence, in order, until `remaining` is spent (PyCore.judge_rows). 0 on error. */
static int judge_each(Core *c, int64_t stage, PyObject *rows, const ScanArgs *a, ScanBest *best) {
    int64_t n = c->stage_ptr[stage + 1] - c->stage_ptr[stage];
    double bound = a->bound_j;
    PyObject *seq = PySequence_Fast(rows, "rows must be a sequence of rows");
    if (!seq) return 0;
    int ok = 1;
    for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); i++) {
        if (best->used >= a->remaining) {
            best->exhausted = 1;
            break;
        }
        best->used++;
        ok = read_row(PySequence_Fast_GET_ITEM(seq, i), n, stage, c->row) && judge(c, stage, a, &bound, best, n);
    }
    Py_DECREF(seq);
    return ok;
}

static PyObject *Core_judge_rows(Core *c, PyObject *args) {
    long long stage, late, late_others, allowed, num_stages, remaining;
    int repairing;
    PyObject *rows_obj, *from_obj, *after_obj;
    ScanArgs a = {0};
    if (!PyArg_ParseTuple(args, "LOOLLLpddddOdLL|d", &stage, &rows_obj, &from_obj, &late, &late_others, &allowed,
                          &repairing, &a.limit_s, &a.bound_j, &a.energy_before, &a.busy_before, &after_obj,
                          &a.p_block_w, &num_stages, &remaining, &a.late_price_j) ||
        !check_stage(c, stage))
        return NULL;
    a.per_late = from_obj != Py_None;
    if (a.per_late && (a.energy_now = PyFloat_AsDouble(from_obj)) == -1.0 && PyErr_Occurred()) return NULL;
    a.late = late, a.late_others = late_others, a.allowed = allowed, a.repairing = repairing;
    a.num_stages = num_stages, a.remaining = remaining > 0 ? remaining : 0;
    int64_t n = c->stage_ptr[stage + 1] - c->stage_ptr[stage];
    double *after_e = zalloc(c->num_stages, 8), *after_b = zalloc(c->num_stages, 8);
    ScanBest best = {0};
    best.row = zalloc(n, 8);
    PyObject *result = NULL;
    if (!(after_e && after_b && best.row))
        PyErr_NoMemory();
    else if (read_after(after_obj, &a, after_e, after_b, c->num_stages - 1 - (int64_t)stage) &&
             judge_each(c, stage, rows_obj, &a, &best))
        result = scan_result(&best, n);
    void *blocks[] = {after_e, after_b, best.row};
    free_blocks(blocks, COUNT_OF(blocks));
    return result;
}

static PyObject *Core_accept(Core *c, PyObject *arg) {
    long long stage = PyLong_AsLongLong(arg);
    if ((stage == -1 && PyErr_Occurred()) || !check_stage(c, stage)) return NULL;
    int64_t first = c->stage_ptr[stage], end = c->stage_ptr[stage + 1];
    memcpy(c->current + first, c->trial + first, sizeof(double) * (size_t)(end - first));
    if (c->opt_wait) {
        memcpy(c->cur_clock + first, c->trial_clock + first, sizeof(int64_t) * (size_t)(end - first));
        memcpy(c->cur_wait + first, c->trial_wait + first, sizeof(double) * (size_t)(end - first));
        memcpy(c->cur_ran + first, c->trial_ran + first, sizeof(double) * (size_t)(end - first));
    }
    Py_RETURN_NONE;
}

/* n floats of a sequence into out; 0 with an exception set when it is not that. */
static int read_durations(PyObject *obj, int64_t n, double *out) {
    int ok = read_numbers(obj, n, "durations must be a sequence of floats", NULL, out);
    if (ok < 0) PyErr_Format(PyExc_ValueError, "need %lld durations", (long long)n);
    return ok > 0;
}

static PyObject *Core_longest(Core *c, PyObject *arg) {
    if (!read_durations(arg, c->n, c->path_in)) return NULL;
    return PyFloat_FromDouble(longest(c, c->path_in));
}

static void Core_dealloc(Core *c) {
    void *blocks[] = {c->pred_ptr, c->pred_idx,  c->topo,    c->stage_ptr, c->opt_ptr,   c->opt_clock,
                      c->opt_time, c->opt_energy, c->current, c->trial,     c->finish,    c->path_in,
                      c->row,      c->effective,  c->run_start, c->run_len, c->times,     c->late,
                      c->opt_wait, c->cur_clock,  c->trial_clock, c->held_clock, c->cur_wait, c->trial_wait,
                      c->held_wait, c->cur_ran,   c->trial_ran, c->held_ran,  c->start,     c->ran_finish,
                      c->planned_k};
    free_blocks(blocks, COUNT_OF(blocks));
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int sizes_consistent(const Core *c, const Py_ssize_t *counts) {
    if (c->n < 1 || counts[0] != c->n + 1 || counts[2] != c->n || counts[4] != c->n + 1 ||
        c->pred_ptr[0] != 0 || c->pred_ptr[c->n] != c->e || c->num_stages < 1 || c->stage_ptr[0] != 0 ||
        c->stage_ptr[c->num_stages] != c->n || counts[5] != c->opt_ptr[c->n] || counts[6] != counts[5] ||
        counts[7] != counts[5] || c->opt_ptr[0] != 0)
        return 0;
    for (int64_t v = 0; v < c->n; v++)
        if (c->opt_ptr[v + 1] <= c->opt_ptr[v] || c->pred_ptr[v + 1] < c->pred_ptr[v] || c->topo[v] < 0 ||
            c->topo[v] >= c->n)
            return 0;
    for (int64_t p = 0; p < c->e; p++)
        if (c->pred_idx[p] < 0 || c->pred_idx[p] >= c->n) return 0;
    for (int64_t v = 0; v < c->n; v++) /* each node's clocks strictly ascending (snap_up bisects them) */
        for (int64_t k = c->opt_ptr[v] + 1; k < c->opt_ptr[v + 1]; k++)
            if (c->opt_clock[k] <= c->opt_clock[k - 1]) return 0;
    for (int64_t s = 0; s < c->num_stages; s++)
        if (c->stage_ptr[s + 1] < c->stage_ptr[s]) return 0;
    return 1;
}

/* The waiting power per option (doubles, one per option, or none: the blocking model) into c->opt_wait. */
static int read_waits(Core *c, PyObject *obj, Py_ssize_t options) {
    Py_ssize_t count = 0;
    double *waits = copy_buffer(obj, "opt_wait", &count);
    if (!waits) return 0;
    if (count == 0) {
        free(waits);
        return 1;
    }
    c->opt_wait = waits;
    if (count != options) {
        PyErr_SetString(PyExc_ValueError, "Core: opt_wait needs one waiting power per option");
        return 0;
    }
    return 1;
}

static int Core_init(Core *c, PyObject *args, PyObject *kwds) {
    PyObject *obj[8];
    Py_ssize_t counts[8];
    static char *names[] = {"pred_ptr",  "pred_idx",   "topo",      "stage_ptr", "opt_ptr",  "opt_clock",
                            "opt_time",  "opt_energy", "latency_s", "lead_s",    "opt_wait", NULL};
    PyObject *wait_obj = NULL;
    if (c->topo) {
        PyErr_SetString(PyExc_RuntimeError, "Core is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOdd|O", names, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &obj[5], &obj[6], &obj[7], &c->latency_s, &c->lead_s, &wait_obj))
        return -1;
    void **dst[8] = {(void **)&c->pred_ptr, (void **)&c->pred_idx, (void **)&c->topo,     (void **)&c->stage_ptr,
                     (void **)&c->opt_ptr,  (void **)&c->opt_clock, (void **)&c->opt_time, (void **)&c->opt_energy};
    if (!copy_buffers(obj, names, dst, counts, 8)) return -1;
    c->n = counts[2];
    c->e = counts[1];
    c->num_stages = counts[3] - 1;
    if (!sizes_consistent(c, counts)) {
        PyErr_SetString(PyExc_ValueError, "Core: inconsistent arrays");
        return -1;
    }
    if (wait_obj && !read_waits(c, wait_obj, counts[5])) return -1;
    for (int64_t s = 0; s < c->num_stages; s++)
        if (c->stage_ptr[s + 1] - c->stage_ptr[s] > c->max_stage)
            c->max_stage = c->stage_ptr[s + 1] - c->stage_ptr[s];
    const WorkArray arrays[] = {
        /* per node */
        {(void **)&c->current, c->n, 8}, {(void **)&c->trial, c->n, 8}, {(void **)&c->finish, c->n, 8},
        {(void **)&c->path_in, c->n, 8},
        /* per computation of the largest stage */
        {(void **)&c->row, c->max_stage, 8}, {(void **)&c->effective, c->max_stage, 8},
        {(void **)&c->run_start, c->max_stage, 8}, {(void **)&c->run_len, c->max_stage, 8},
        {(void **)&c->times, c->max_stage, 8}, {(void **)&c->late, c->max_stage, 1},
        {(void **)&c->planned_k, c->max_stage, 8},
        /* per node, used with opt_wait */
        {(void **)&c->cur_clock, c->n, 8}, {(void **)&c->trial_clock, c->n, 8}, {(void **)&c->held_clock, c->n, 8},
        {(void **)&c->cur_wait, c->n, 8}, {(void **)&c->trial_wait, c->n, 8}, {(void **)&c->held_wait, c->n, 8},
        {(void **)&c->cur_ran, c->n, 8}, {(void **)&c->trial_ran, c->n, 8}, {(void **)&c->held_ran, c->n, 8},
        {(void **)&c->start, c->n, 8}, {(void **)&c->ran_finish, c->n, 8},
    };
    if (!alloc_arrays(arrays, COUNT_OF(arrays))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyMethodDef Core_methods[] = {
    {"stage_cost", (PyCFunction)Core_stage_cost, METH_VARARGS,
     "stage_cost(stage, row) -> (energy_j, busy_s, late): the row as the descent judges it; its durations become "
     "the stage's trial."},
    {"scan", (PyCFunction)Core_scan, METH_VARARGS,
     "scan(stage, row, late, late_others, allowed, repairing, limit_s, bound_j, energy_before, busy_before, "
     "after, p_block_w, num_stages, remaining[, late_price_j]) -> (used, exhausted, best): switch_core.PyCore.scan."},
    {"judge_rows", (PyCFunction)Core_judge_rows, METH_VARARGS,
     "judge_rows(stage, rows, per_late_from_j, late, ..., remaining[, late_price_j]) -> (used, exhausted, best): "
     "switch_core.PyCore.judge_rows."},
    {"trial_time", (PyCFunction)Core_trial_time, METH_O,
     "trial_time(stage) -> the longest path with the stage's trial durations."},
    {"follow_row", (PyCFunction)Core_follow_row, METH_VARARGS,
     "follow_row(stage, row) -> (effective clocks, late begins, times, energies): switch_core.PyCore.follow_row."},
    {"merged", (PyCFunction)Core_merged, METH_VARARGS,
     "merged(stage, row, min_run_s) -> the row's short lowered runs merged (switching.merged_stage_clocks)."},
    {"trial_waits", (PyCFunction)Core_trial_waits, METH_VARARGS,
     "trial_waits(stage, time_s) -> the waits' energy with the stage's trial (switch_core.PyCore.trial_waits)."},
    {"accept", (PyCFunction)Core_accept, METH_O, "accept(stage): the stage's trial becomes its current durations."},
    {"longest", (PyCFunction)Core_longest, METH_O, "longest(durations) -> the longest path through the DAG."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CoreType = {
    CORE_TYPE_SLOTS("perseusd.planner._switchcore.Core", Core,
                    "One job's DAG, measured options and switch model: the descent's inner loops.", Core_init,
                    Core_dealloc, Core_methods),
};

/* Paths: a DAG alone, for evaluate.longest_path_s, and (given its stages) waiting.held_waits_j. */
typedef struct {
    PyObject_HEAD
    int64_t n, num_stages;
    int64_t *pred_ptr, *pred_idx, *topo, *stage_ptr, *clock;
    double *finish, *durations, *wait, *start;
} Paths;

static PyObject *Paths_longest(Paths *p, PyObject *arg) {
    if (!read_durations(arg, p->n, p->durations)) return NULL;
    return PyFloat_FromDouble(longest_path(p->n, p->pred_ptr, p->pred_idx, p->topo, p->finish, p->durations));
}

static PyObject *Paths_held_waits(Paths *p, PyObject *args) {
    PyObject *clocks, *waits, *ran;
    double time_s, latency_s;
    if (!PyArg_ParseTuple(args, "OOOdd", &clocks, &waits, &ran, &time_s, &latency_s)) return NULL;
    if (!p->stage_ptr) {
        PyErr_SetString(PyExc_ValueError, "held_waits needs the Paths built with stage_ptr");
        return NULL;
    }
    int ok = read_numbers(clocks, p->n, "clocks must be a sequence of clocks", p->clock, NULL);
    if (ok > 0) ok = read_numbers(waits, p->n, "waits must be a sequence of floats", NULL, p->wait);
    if (ok > 0) ok = read_numbers(ran, p->n, "times must be a sequence of floats", NULL, p->durations);
    if (ok < 0) PyErr_Format(PyExc_ValueError, "need %lld clocks, waits and times", (long long)p->n);
    if (ok <= 0) return NULL;
    StagedDag dag = {p->n, p->num_stages, p->pred_ptr, p->pred_idx, p->topo, p->stage_ptr};
    return PyFloat_FromDouble(held_energy(&dag, p->clock, p->wait, p->durations, p->start, p->finish, time_s,
                                          latency_s));
}

static void Paths_dealloc(Paths *p) {
    void *blocks[] = {p->pred_ptr, p->pred_idx, p->topo,  p->stage_ptr, p->clock,
                      p->finish,   p->durations, p->wait, p->start};
    free_blocks(blocks, COUNT_OF(blocks));
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* Whether stage_ptr (count + 1 entries) cuts nodes 0..n into consecutive stages. */
static int stages_cover(const int64_t *stage_ptr, Py_ssize_t count, int64_t n) {
    if (count < 2 || stage_ptr[0] != 0 || stage_ptr[count - 1] != n) return 0;
    for (Py_ssize_t s = 1; s < count; s++)
        if (stage_ptr[s] < stage_ptr[s - 1]) return 0;
    return 1;
}

static int Paths_init(Paths *p, PyObject *args, PyObject *kwds) {
    PyObject *obj[4] = {NULL, NULL, NULL, NULL};
    Py_ssize_t counts[4] = {0, 0, 0, 0};
    static char *names[] = {"pred_ptr", "pred_idx", "topo", "stage_ptr", NULL};
    if (p->topo) {
        PyErr_SetString(PyExc_RuntimeError, "Paths is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|O", names, &obj[0], &obj[1], &obj[2], &obj[3])) return -1;
    void **dst[4] = {(void **)&p->pred_ptr, (void **)&p->pred_idx, (void **)&p->topo, (void **)&p->stage_ptr};
    if (!copy_buffers(obj, names, dst, counts, obj[3] && obj[3] != Py_None ? 4 : 3)) return -1;
    p->n = counts[2];
    int ok = counts[0] == p->n + 1 && p->pred_ptr[0] == 0 && p->pred_ptr[p->n] == counts[1];
    for (int64_t v = 0; ok && v < p->n; v++)
        ok = p->pred_ptr[v + 1] >= p->pred_ptr[v] && p->topo[v] >= 0 && p->topo[v] < p->n;
    for (int64_t e = 0; ok && e < counts[1]; e++) ok = p->pred_idx[e] >= 0 && p->pred_idx[e] < p->n;
    if (ok && p->stage_ptr) ok = stages_cover(p->stage_ptr, counts[3], p->n);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "Paths: inconsistent arrays");
        return -1;
    }
    p->num_stages = p->stage_ptr ? counts[3] - 1 : 0;
    p->finish = zalloc(p->n, 8);
    p->durations = zalloc(p->n, 8);
    p->clock = zalloc(p->n, 8);
    p->wait = zalloc(p->n, 8);
    p->start = zalloc(p->n, 8);
    if (!(p->finish && p->durations && p->clock && p->wait && p->start)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyMethodDef Paths_methods[] = {
    {"longest", (PyCFunction)Paths_longest, METH_O, "longest(durations) -> the longest path through the DAG."},
    {"held_waits", (PyCFunction)Paths_held_waits, METH_VARARGS,
     "held_waits(clocks, waits_w, times_s, time_s, latency_s) -> waiting.held_waits_j (needs stage_ptr)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PathsType = {
    CORE_TYPE_SLOTS("perseusd.planner._switchcore.Paths", Paths, "A DAG's longest path (evaluate.longest_path_s) and held waits (waiting.held_waits_j).",
                    Paths_init, Paths_dealloc, Paths_methods),
};

static struct PyModuleDef switchcore_module = {PyModuleDef_HEAD_INIT, "_switchcore",
                                               "C inner loops of plan following and the switch-aware descent.", -1,
                                               NULL};

/* The interface version: bump it, and `perseusd.planner.compiled.ABI`, whenever a signature changes. */
#define SWITCHCORE_ABI 4

PyMODINIT_FUNC PyInit__switchcore(void) {
    PyTypeObject *types[] = {&CoreType, &PathsType};
    return module_with_types(&switchcore_module, types, COUNT_OF(types), SWITCHCORE_ABI);
}
