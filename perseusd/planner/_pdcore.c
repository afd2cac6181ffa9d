/*
 * The Phillips-Dessouky iteration of the Perseus frontier solver, in C.
 *
 * Same interface and same results as the pure-Python reference in pd_core.py, which is its executable
 * specification (the tests run both on the same inputs). Capacities are integers in units of 1e-6 J, so the
 * max flow is exact and the minimal minimum cut (the nodes reachable from s in the residual graph) is
 * unique: any correct max-flow algorithm gives the same cut. Dinic's algorithm is used here.
 *
 * What it saves, measured (`perseusctl solve`'s solve_s with and without this module built, same tree, same
 * 2-core machine, load 3-8): bundled a100_sxm 8 x 12 0.028 s against 5.2 s in pd_core.py (186x); A40 8 x 12
 * at 0.1 ms (11,832 points) 0.35 s against 73 s (207x); a100_sxm 8 x 96 0.63 s against 228 s (361x). The
 * daemon plans a job's frontier in its solver worker while the job waits, so minutes in Python are not an
 * option; pd_core.py stays as the specification and the fallback where no C compiler is found.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cshared.h"

#define EPS 1e-6
static const int64_t BIG = (int64_t)1 << 60;

typedef struct {
    PyObject_HEAD
    int64_t n, e;
    int64_t *pred_ptr, *pred_idx, *succ_ptr, *succ_idx, *topo, *min_q, *max_q, *cost_ptr;
    double *cost, *rt, *re, *finish;
    /* the bounds of a computation's arc at every duration (by cost slot), computed once: see bounds() */
    int64_t *lb_tab, *ub_tab;
    /* every computation's cost slot at its current duration and that slot's cost and measured time and
     * energy, kept up to date with d (read in sequence every iteration instead of looked up in the tables) */
    int64_t *slot, *cur_lb, *cur_ub;
    double *cur_cost, *cur_rt, *cur_re;
    int64_t *d, *ef, *lf;
    int64_t num_stages, inf_units;
    double p_block;
    int64_t t_min, t_max, t_cur;
    int done, stop_on_zero;
    /* critical arcs */
    int64_t n_arcs, *arc_u, *arc_v, *arc_lb, *arc_ub, *arc_comp, *arc_key, *arc_net;
    /* the last maximum flow on every arc (by key: computation, DAG edge, source/sink arc), the warm start */
    int64_t *flow, back_flow;
    /* one object per cost slot (the clock of that slot), set by set_clock_table */
    PyObject *clock_table;
    /* flow network (forward star) */
    int64_t nodes, m, m_max;
    int64_t *head, *nxt, *to, *cap, *level, *it, *queue, *path, *excess;
    unsigned char *seen;
} PdCore;

/* Python's float floor division x // 1e-6 for x >= 0, exactly (CPython's float_floor_div). */
static int64_t to_units(double x) {
    const double y = EPS;
    double mod = fmod(x, y);
    double div = (x - mod) / y;
    double fl;
    if (mod != 0.0 && ((y < 0) != (mod < 0))) {
        mod += y;
        div -= 1.0;
    }
    if (div != 0.0) {
        fl = floor(div);
        if (div - fl > 0.5) fl += 1.0;
    } else {
        fl = 0.0;
    }
    return (int64_t)fl;
}

static double cost_at(PdCore *s, int64_t i, int64_t q) { return s->cost[s->cost_ptr[i] + q - s->min_q[i]]; }

static void set_duration(PdCore *s, int64_t i, int64_t d) {
    int64_t slot = s->cost_ptr[i] + d - s->min_q[i];
    s->d[i] = d;
    s->slot[i] = slot;
    s->cur_cost[i] = s->cost[slot];
    s->cur_rt[i] = s->rt[slot];
    s->cur_re[i] = s->re[slot];
    s->cur_lb[i] = s->lb_tab[slot];
    s->cur_ub[i] = s->ub_tab[slot];
}

static void cpm(PdCore *s) {
    int64_t total = 0;
    for (int64_t k = 0; k < s->n; k++) {
        int64_t v = s->topo[k], start = 0;
        for (int64_t p = s->pred_ptr[v]; p < s->pred_ptr[v + 1]; p++)
            if (s->ef[s->pred_idx[p]] > start) start = s->ef[s->pred_idx[p]];
        s->ef[v] = start + s->d[v];
    }
    for (int64_t v = 0; v < s->n; v++)
        if (s->succ_ptr[v] == s->succ_ptr[v + 1] && s->ef[v] > total) total = s->ef[v];
    for (int64_t k = s->n - 1; k >= 0; k--) {
        int64_t v = s->topo[k], latest = total;
        for (int64_t p = s->succ_ptr[v]; p < s->succ_ptr[v + 1]; p++) {
            int64_t w = s->succ_idx[p];
            if (s->lf[w] - s->d[w] < latest) latest = s->lf[w] - s->d[w];
        }
        s->lf[v] = latest;
    }
    s->t_cur = total;
}

/* The capacity bounds of computation i's arc at duration d (the reference's formulas, in 1e-6 J units). */
static void bounds_at(PdCore *s, int64_t i, int64_t d, int64_t *lb, int64_t *ub) {
    int64_t lo = s->min_q[i], hi = s->max_q[i];
    if (lo == hi && hi == d) {
        *lb = 0;
        *ub = s->inf_units;
    } else if (d - 1 < lo) {
        *lb = to_units(fabs(cost_at(s, i, d) - cost_at(s, i, d + 1)));
        *ub = s->inf_units;
    } else if (d + 1 > hi) {
        *lb = 0;
        *ub = to_units(fabs(cost_at(s, i, d - 1) - cost_at(s, i, d)));
    } else {
        double l = fabs(cost_at(s, i, d) - cost_at(s, i, d + 1));
        double u = fabs(cost_at(s, i, d - 1) - cost_at(s, i, d)) + EPS;
        *lb = to_units(l);
        *ub = to_units(u);
    }
}

/* Every computation's bounds at every duration, once (to_units' exact floor division is slow). */
static void bound_tables(PdCore *s) {
    for (int64_t i = 0; i < s->n; i++)
        for (int64_t d = s->min_q[i]; d <= s->max_q[i]; d++) {
            int64_t slot = s->cost_ptr[i] + d - s->min_q[i];
            bounds_at(s, i, d, &s->lb_tab[slot], &s->ub_tab[slot]);
        }
}

static void add_arc(PdCore *s, int64_t u, int64_t v, int64_t lb, int64_t ub, int64_t comp, int64_t key) {
    int64_t k = s->n_arcs++;
    s->arc_key[k] = key;
    s->arc_u[k] = u;
    s->arc_v[k] = v;
    s->arc_lb[k] = lb;
    s->arc_ub[k] = ub;
    s->arc_comp[k] = comp;
}

static void critical_arcs(PdCore *s) {
    int64_t n = s->n, src_l = 2 * n, src_r = 2 * n + 1, snk_l = 2 * n + 2, snk_r = 2 * n + 3;
    s->n_arcs = 0;
    int64_t edge_keys = n, src_keys = n + s->e, snk_keys = 2 * n + s->e, special_keys = 3 * n + s->e;
    add_arc(s, src_l, src_r, 0, s->inf_units, -1, special_keys);
    add_arc(s, snk_l, snk_r, 0, s->inf_units, -1, special_keys + 1);
    for (int64_t v = 0; v < n; v++) {
        int64_t ls = s->lf[v] - s->d[v];
        if (s->ef[v] == s->lf[v]) add_arc(s, 2 * v, 2 * v + 1, s->cur_lb[v], s->cur_ub[v], v, v);
        if (s->pred_ptr[v] == s->pred_ptr[v + 1] && ls == 0)
            add_arc(s, src_r, 2 * v, 0, s->inf_units, -1, src_keys + v);
        if (s->succ_ptr[v] == s->succ_ptr[v + 1] && s->ef[v] == s->t_cur)
            add_arc(s, 2 * v + 1, snk_l, 0, s->inf_units, -1, snk_keys + v);
        for (int64_t p = s->pred_ptr[v]; p < s->pred_ptr[v + 1]; p++) {
            int64_t u = s->pred_idx[p];
            if (s->ef[u] == ls) add_arc(s, 2 * u + 1, 2 * v, 0, s->inf_units, -1, edge_keys + p);
        }
    }
}

static int64_t net_add(PdCore *s, int64_t u, int64_t v, int64_t c) {
    int64_t k = s->m;
    s->to[k] = v;
    s->cap[k] = c;
    s->nxt[k] = s->head[u];
    s->head[u] = k;
    s->to[k + 1] = u;
    s->cap[k + 1] = 0;
    s->nxt[k + 1] = s->head[v];
    s->head[v] = k + 1;
    s->m += 2;
    return k;
}

static int bfs_levels(PdCore *s, int64_t src, int64_t dst) {
    int64_t qh = 0, qt = 0;
    for (int64_t i = 0; i < s->nodes; i++) s->level[i] = -1;
    s->level[src] = 0;
    s->queue[qt++] = src;
    while (qh < qt) {
        int64_t u = s->queue[qh++];
        for (int64_t e = s->head[u]; e >= 0; e = s->nxt[e])
            if (s->cap[e] > 0 && s->level[s->to[e]] < 0) {
                s->level[s->to[e]] = s->level[u] + 1;
                /* Every node of a shorter level is labelled now; deeper ones cannot be on a shortest path. */
                if (s->to[e] == dst) return 1;
                s->queue[qt++] = s->to[e];
            }
    }
    return s->level[dst] >= 0;
}

static int64_t augment(PdCore *s, int64_t src, int64_t dst) {
    int64_t depth = 0, u = src, e;
    while (u != dst) {
        for (e = s->it[u]; e >= 0; e = s->nxt[e])
            if (s->cap[e] > 0 && s->level[s->to[e]] == s->level[u] + 1) break;
        s->it[u] = e;
        if (e < 0) {
            if (depth == 0) return 0;
            s->level[u] = -1;
            u = s->to[s->path[--depth] ^ 1];
            s->it[u] = s->nxt[s->it[u]];
            continue;
        }
        s->path[depth++] = e;
        u = s->to[e];
    }
    int64_t pushed = BIG;
    for (int64_t k = 0; k < depth; k++)
        if (s->cap[s->path[k]] < pushed) pushed = s->cap[s->path[k]];
    for (int64_t k = 0; k < depth; k++) {
        s->cap[s->path[k]] -= pushed;
        s->cap[s->path[k] ^ 1] += pushed;
    }
    return pushed;
}

static int64_t max_flow(PdCore *s, int64_t src, int64_t dst) {
    int64_t total = 0, pushed;
    while (bfs_levels(s, src, dst)) {
        memcpy(s->it, s->head, sizeof(int64_t) * s->nodes);
        while ((pushed = augment(s, src, dst)) > 0) total += pushed;
    }
    return total;
}

static void zero_node(PdCore *s, int64_t node) {
    for (int64_t e = s->head[node]; e >= 0; e = s->nxt[e]) s->cap[e] = s->cap[e ^ 1] = 0;
}

/* Returns 1 and fills s->seen with the source side of the minimal min cut, or 0 when infeasible. */
static int min_cut(PdCore *s) {
    int64_t n = s->n, src = 2 * n, dst = 2 * n + 3, ss = 2 * n + 4, tt = 2 * n + 5, demand = 0;
    s->m = 0;
    for (int64_t i = 0; i < s->nodes; i++) {
        s->head[i] = -1;
        s->excess[i] = 0;
    }
    for (int64_t k = 0; k < s->n_arcs; k++)
        if (s->arc_ub[k] < s->arc_lb[k]) return 0;
    /* Warm start: every arc starts at its flow in the last iteration's maximum flow, clamped into [lb, ub]
     * (base b). Forward residual ub - b, backward b - lb; the imbalances of the bases are the demands of the
     * feasibility flow. Any start gives the same feasibility verdict and, after the maximum flow, the same
     * minimal minimum cut; a good start only makes both flows short. */
    for (int64_t k = 0; k < s->n_arcs; k++) {
        int64_t lb = s->arc_lb[k], ub = s->arc_ub[k], b = s->flow[s->arc_key[k]];
        b = b < lb ? lb : (b > ub ? ub : b);
        int64_t e = net_add(s, s->arc_u[k], s->arc_v[k], ub - b);
        s->cap[e ^ 1] = b - lb;
        s->arc_net[k] = e;
        s->excess[s->arc_v[k]] += b;
        s->excess[s->arc_u[k]] -= b;
    }
    int64_t back = net_add(s, dst, src, BIG - s->back_flow);
    s->cap[back ^ 1] = s->back_flow;
    s->excess[src] += s->back_flow;
    s->excess[dst] -= s->back_flow;
    for (int64_t i = 0; i < s->nodes; i++) {
        if (s->excess[i] > 0) {
            net_add(s, ss, i, s->excess[i]);
            demand += s->excess[i];
        } else if (s->excess[i] < 0) {
            net_add(s, i, tt, -s->excess[i]);
        }
    }
    if (max_flow(s, ss, tt) != demand) return 0;
    s->cap[back] = s->cap[back ^ 1] = 0;
    zero_node(s, ss);
    zero_node(s, tt);
    max_flow(s, src, dst);
    memset(s->flow, 0, sizeof(int64_t) * (size_t)(3 * n + s->e + 2));
    s->back_flow = 0;
    for (int64_t k = 0; k < s->n_arcs; k++) {
        int64_t f = s->arc_lb[k] + s->cap[s->arc_net[k] ^ 1];
        s->flow[s->arc_key[k]] = f;
        if (s->arc_u[k] == src) s->back_flow += f;
    }
    int64_t qh = 0, qt = 0;
    memset(s->seen, 0, (size_t)s->nodes);
    s->seen[src] = 1;
    s->queue[qt++] = src;
    while (qh < qt) {
        int64_t u = s->queue[qh++];
        for (int64_t e = s->head[u]; e >= 0; e = s->nxt[e])
            if (s->cap[e] > 0 && !s->seen[s->to[e]]) {
                s->seen[s->to[e]] = 1;
                s->queue[qt++] = s->to[e];
            }
    }
    return 1;
}

/* Applies the cut; returns 1 with *change set, or 0 when the procedure must stop (infinite change). */
static int apply_cut(PdCore *s, double *change) {
    int64_t ups = 0;
    *change = 0.0;
    for (int64_t k = 0; k < s->n_arcs; k++) {
        int64_t i = s->arc_comp[k];
        if (s->seen[s->arc_u[k]] && !s->seen[s->arc_v[k]]) {
            ups++;
            if (i < 0 || s->d[i] - 1 < s->min_q[i]) return 0;
        } else if (!s->seen[s->arc_u[k]] && s->seen[s->arc_v[k]]) {
            if (i >= 0 && s->d[i] + 1 > s->max_q[i]) return 0;
        }
    }
    if (ups == 0) return 0;
    for (int64_t k = 0; k < s->n_arcs; k++) {
        int64_t i = s->arc_comp[k];
        if (s->seen[s->arc_u[k]] && !s->seen[s->arc_v[k]]) {
            *change += fabs(cost_at(s, i, s->d[i] - 1) - cost_at(s, i, s->d[i]));
            set_duration(s, i, s->d[i] - 1);
        }
    }
    for (int64_t k = 0; k < s->n_arcs; k++) {
        int64_t i = s->arc_comp[k];
        if (i >= 0 && !s->seen[s->arc_u[k]] && s->seen[s->arc_v[k]]) {
            *change -= fabs(cost_at(s, i, s->d[i]) - cost_at(s, i, s->d[i] + 1));
            set_duration(s, i, s->d[i] + 1);
        }
    }
    return 1;
}

static PyObject *refined_point(PdCore *s) {
    double model = 0.0, busy = 0.0, energy = 0.0, time_s = 0.0;
    for (int64_t i = 0; i < s->n; i++) model += s->cur_cost[i];
    for (int64_t k = 0; k < s->n; k++) {
        int64_t v = s->topo[k];
        double start = 0.0;
        for (int64_t p = s->pred_ptr[v]; p < s->pred_ptr[v + 1]; p++)
            if (s->finish[s->pred_idx[p]] > start) start = s->finish[s->pred_idx[p]];
        s->finish[v] = start + s->cur_rt[v];
        busy += s->cur_rt[v];
        energy += s->cur_re[v];
    }
    for (int64_t i = 0; i < s->n; i++)
        if (s->finish[i] > time_s) time_s = s->finish[i];
    energy += s->p_block * ((double)s->num_stages * time_s - busy);
    return Py_BuildValue("(iLddd)", 0, (long long)s->t_cur, model, time_s, energy);
}

static PyObject *PdCore_step(PdCore *s, PyObject *Py_UNUSED(ignored)) {
    double change;
    int64_t before = s->t_cur;
    if (s->done) Py_RETURN_NONE;
    critical_arcs(s);
    if (!min_cut(s) || !apply_cut(s, &change) || (s->stop_on_zero && fabs(change) < EPS)) {
        s->done = 1;
        Py_RETURN_NONE;
    }
    cpm(s);
    if (s->t_cur >= before) {
        s->done = 1;
        Py_RETURN_NONE;
    }
    return refined_point(s);
}

static PyObject *PdCore_durations(PdCore *s, PyObject *Py_UNUSED(ignored)) {
    PyObject *list = PyList_New((Py_ssize_t)s->n);
    if (!list) return NULL;
    for (int64_t i = 0; i < s->n; i++) {
        PyObject *item = PyLong_FromLongLong((long long)s->d[i]);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item);
    }
    return list;
}

static PyObject *PdCore_set_clock_table(PdCore *s, PyObject *table) {
    if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) != (Py_ssize_t)s->cost_ptr[s->n]) {
        PyErr_SetString(PyExc_ValueError, "set_clock_table: expected a tuple with one item per cost slot");
        return NULL;
    }
    Py_INCREF(table);
    Py_XSETREF(s->clock_table, table);
    Py_RETURN_NONE;
}

static PyObject *PdCore_clocks(PdCore *s, PyObject *Py_UNUSED(ignored)) {
    if (!s->clock_table) {
        PyErr_SetString(PyExc_RuntimeError, "clocks: call set_clock_table first");
        return NULL;
    }
    PyObject *clocks = PyTuple_New((Py_ssize_t)s->n);
    if (!clocks) return NULL;
    for (int64_t i = 0; i < s->n; i++) {
        PyObject *item = PyTuple_GET_ITEM(s->clock_table, s->slot[i]);
        Py_INCREF(item);
        PyTuple_SET_ITEM(clocks, (Py_ssize_t)i, item);
    }
    return clocks;
}

static void PdCore_dealloc(PdCore *s) {
    Py_CLEAR(s->clock_table);
    void *blocks[] = {s->lb_tab, s->ub_tab, s->slot, s->cur_lb, s->cur_ub, s->cur_cost, s->cur_rt, s->cur_re, s->pred_ptr, s->pred_idx, s->succ_ptr, s->succ_idx, s->topo, s->min_q, s->max_q,
                      s->cost_ptr, s->cost, s->rt, s->re, s->finish, s->d, s->ef, s->lf, s->arc_u, s->arc_v,
                      s->arc_lb, s->arc_ub, s->arc_comp, s->arc_key, s->arc_net, s->flow, s->head, s->nxt, s->to, s->cap, s->level, s->it,
                      s->queue, s->path, s->excess, s->seen};
    free_blocks(blocks, COUNT_OF(blocks));
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Every work array, zeroed; 1 when all were allocated. */
static int allocate_work(PdCore *s) {
    int64_t n = s->n, arcs = 2 * n + s->e + 2 * n + 2, slots = s->cost_ptr[n];
    s->nodes = 2 * n + 6;
    s->m_max = 2 * (arcs + 1 + s->nodes);
    const WorkArray arrays[] = {
        /* the DAG's successors and the warm start's flows (by arc key) */
        {(void **)&s->succ_ptr, n + 1, 8}, {(void **)&s->succ_idx, s->e, 8}, {(void **)&s->flow, 3 * n + s->e + 2, 8},
        /* per computation */
        {(void **)&s->finish, n, 8}, {(void **)&s->d, n, 8}, {(void **)&s->ef, n, 8}, {(void **)&s->lf, n, 8},
        {(void **)&s->slot, n, 8}, {(void **)&s->cur_lb, n, 8}, {(void **)&s->cur_ub, n, 8},
        {(void **)&s->cur_cost, n, 8}, {(void **)&s->cur_rt, n, 8}, {(void **)&s->cur_re, n, 8},
        /* per cost slot */
        {(void **)&s->lb_tab, slots, 8}, {(void **)&s->ub_tab, slots, 8},
        /* per critical arc */
        {(void **)&s->arc_u, arcs, 8}, {(void **)&s->arc_v, arcs, 8}, {(void **)&s->arc_lb, arcs, 8},
        {(void **)&s->arc_ub, arcs, 8}, {(void **)&s->arc_comp, arcs, 8}, {(void **)&s->arc_key, arcs, 8},
        {(void **)&s->arc_net, arcs, 8},
        /* the flow network: per node, per residual arc */
        {(void **)&s->head, s->nodes, 8}, {(void **)&s->level, s->nodes, 8}, {(void **)&s->it, s->nodes, 8},
        {(void **)&s->queue, s->nodes, 8}, {(void **)&s->path, s->nodes, 8}, {(void **)&s->excess, s->nodes, 8},
        {(void **)&s->seen, s->nodes, 1},
        {(void **)&s->nxt, s->m_max, 8}, {(void **)&s->to, s->m_max, 8}, {(void **)&s->cap, s->m_max, 8},
    };
    return alloc_arrays(arrays, COUNT_OF(arrays));
}

static void build_successors(PdCore *s) {
    int64_t n = s->n;
    int64_t *fill = zalloc(n + 1, 8);
    for (int64_t p = 0; p < s->e; p++) s->succ_ptr[s->pred_idx[p] + 1]++;
    for (int64_t v = 0; v < n; v++) s->succ_ptr[v + 1] += s->succ_ptr[v];
    memcpy(fill, s->succ_ptr, sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t v = 0; v < n; v++)
        for (int64_t p = s->pred_ptr[v]; p < s->pred_ptr[v + 1]; p++) s->succ_idx[fill[s->pred_idx[p]]++] = v;
    free(fill);
}

static int PdCore_init(PdCore *s, PyObject *args, PyObject *kwds) {
    PyObject *obj[9];
    long long num_stages;
    double p_block;
    int stop_on_zero = 1;
    Py_ssize_t counts[9];
    static char *names[] = {"pred_ptr", "pred_idx", "topo", "min_q", "max_q", "cost_ptr",
                            "cost_val", "rt_val", "re_val", "num_stages", "p_block_w", "stop_on_zero_change", NULL};
    if (s->d) {
        PyErr_SetString(PyExc_RuntimeError, "PdCore is already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOOLd|p", names, &obj[0], &obj[1], &obj[2], &obj[3],
                                     &obj[4], &obj[5], &obj[6], &obj[7], &obj[8], &num_stages, &p_block,
                                     &stop_on_zero))
        return -1;
    void **dst[9] = {(void **)&s->pred_ptr, (void **)&s->pred_idx, (void **)&s->topo, (void **)&s->min_q,
                     (void **)&s->max_q, (void **)&s->cost_ptr, (void **)&s->cost, (void **)&s->rt,
                     (void **)&s->re};
    if (!copy_buffers(obj, names, dst, counts, 9)) return -1;
    s->n = counts[3];
    s->e = counts[1];
    if (s->n < 1 || counts[0] != s->n + 1 || counts[2] != s->n || counts[4] != s->n || counts[5] != s->n + 1 ||
        counts[6] != s->cost_ptr[s->n] || counts[7] != counts[6] || counts[8] != counts[6] ||
        s->pred_ptr[s->n] != s->e) {
        PyErr_SetString(PyExc_ValueError, "PdCore: inconsistent array sizes");
        return -1;
    }
    s->num_stages = num_stages;
    s->p_block = p_block;
    s->stop_on_zero = stop_on_zero;
    s->inf_units = to_units(10000.0);
    if (!allocate_work(s)) {
        PyErr_NoMemory();
        return -1;
    }
    build_successors(s);
    bound_tables(s);
    memcpy(s->d, s->min_q, sizeof(int64_t) * (size_t)s->n);
    cpm(s);
    s->t_min = s->t_cur;
    for (int64_t i = 0; i < s->n; i++) set_duration(s, i, s->max_q[i]);
    cpm(s);
    s->t_max = s->t_cur;
    return 0;
}

static PyMethodDef PdCore_methods[] = {
    {"step", (PyCFunction)PdCore_step, METH_NOARGS,
     "One iteration: (0, quant_time, model_cost_j, refined_time_s, refined_energy_j), or None when done."},
    {"durations", (PyCFunction)PdCore_durations, METH_NOARGS, "The current quantised durations."},
    {"set_clock_table", (PyCFunction)PdCore_set_clock_table, METH_O,
     "Give the clock of every cost slot (a tuple, one item per slot), for clocks()."},
    {"clocks", (PyCFunction)PdCore_clocks, METH_NOARGS,
     "The clock of every computation at the current durations (items of the clock table)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef PdCore_members[] = {
    {"t_min", T_LONGLONG, offsetof(PdCore, t_min), READONLY, "Quantised time with every computation fastest."},
    {"t_max", T_LONGLONG, offsetof(PdCore, t_max), READONLY, "Quantised time with every computation slowest."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PdCoreType = {
    CORE_TYPE_SLOTS("perseusd.planner._pdcore.PdCore", PdCore,
                    "The Phillips-Dessouky solver state (see pd_core.PdCore for the interface).", PdCore_init,
                    PdCore_dealloc, PdCore_methods),
    .tp_members = PdCore_members,
};

static struct PyModuleDef pdcore_module = {PyModuleDef_HEAD_INIT, "_pdcore",
                                           "C core of the Perseus frontier solver.", -1, NULL};

/* The interface version: bump it, and `perseusd.planner.compiled.ABI`, whenever a signature changes. */
#define PDCORE_ABI 1

PyMODINIT_FUNC PyInit__pdcore(void) {
    PyTypeObject *types[] = {&PdCoreType};
    return module_with_types(&pdcore_module, types, COUNT_OF(types), PDCORE_ABI);
}
