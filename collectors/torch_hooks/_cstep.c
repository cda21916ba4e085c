/*
 * collectors.torch_hooks._cstep: the step timing slot of instrument(), in C.
 *
 * Why C: between two real forward passes every line of the collector's Python
 * code and data has left the CPU caches, so the ~50 bytecodes of the Python
 * timing function (and the tuple and integers it allocates per step) cost
 * 5-10 us per step on a tiny CPU model, against ~1 us when run hot
 * (benchmarks/bench_hooks.py). This object does the same work as the inline
 * path of collectors.torch_hooks._forward_of in a few hundred instructions
 * and writes each step as seven int64s into a buffer the writer thread
 * drains, allocating nothing per step.
 *
 * It is installed as the module's `_compiled_call_impl` (the slot
 * Module.__call__ checks first) and does what the Python slot does:
 *
 *   - recording off (its `active` and `enabled` flags, kept by HookHandle.remove() and the
 *     Recorder's `enabled` setter, so no Python object is read per call): call the module;
 *   - read batch and q_len from the input's shape and the tokens already in
 *     the cache from CPU metadata only (a transformers >= 4.56 cache's first
 *     DynamicLayer, or a 4.4x DynamicCache's key_cache list); a cache type
 *     seen first is classified by the Python `classify(cache)`;
 *   - anything else (another cache, an odd input) takes the Python general
 *     path, `general(module, start_ns, args, kwargs)`, which times the call
 *     itself;
 *   - call `module.forward` directly when nothing hooks the module and no
 *     torch.jit.trace_module is recording scopes (what Module._call_impl
 *     would do then too), else `_call_impl`;
 *   - after the call: a step id from the shared counter, the row into the
 *     buffer (or counted in `sink.dropped` when `max_rows` are pending), the
 *     step as a tuple into the capture list of this context if one is open.
 *
 * It never raises into the caller for its own failures: they are handed to
 * `recorder.error("torch_hooks", exc)`. An exception from the model itself
 * passes through unchanged. Every Python-visible effect happens with the GIL
 * held and the buffer is never touched across a call that could run Python
 * code, so the writer thread's take() always sees whole rows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <structmember.h>

#define NCOLS 7 /* step_id, start_ns, end_ns, batch, q_len, kv_len, prefill */

/* Code layout. Between two real forward passes the code of the per-call path is as cold as its
 * data, and on this project's VMs each 4 KiB code page it spans costs a TLB walk: spread over
 * three pages as the compiler laid it out, it cost ~1 us per step more than on one (medians over
 * six and eight processes of benchmarks/bench_hooks.py's part 3 with both builds side by side;
 * see benchmarks/RESULTS.md). So the functions of that path go to one section that starts on a
 * page (call_module is emitted first and carries the alignment; the others are inlined into
 * slot_vectorcall or follow it), and what only a first call or a failure runs is marked cold,
 * which moves it, and the blocks that call it, out of the way. */
#if defined(__GNUC__) && defined(__ELF__)
#define HOT __attribute__((hot, section(".text.tracetool_step")))
#define HOT_PAGE __attribute__((aligned(4096)))
#define COLD __attribute__((cold, noinline))
#else
#define HOT
#define HOT_PAGE
#define COLD
#endif

/* The rows waiting for the writer: what the steps sink holds (never the model). */
typedef struct {
    PyObject_HEAD
    int64_t *buf;
    Py_ssize_t rows, alloc_rows, max_rows;
} StepRows;

static PyTypeObject StepRowsType;

/* What every call reads, together, so that it costs the fewest cache lines: the process's step
 * id counter, the count of open capture() blocks (both also Python objects: `step_ids`, an
 * iterator, and `capturing`, a one-item memoryview), and the names the inline path looks up. */
static struct {
    long long next_step_id;
    int64_t capturing;
    PyObject *input_ids, *cache, *past_key_values, *shape, *layers, *keys, *forward, *trace_module_map;
} G __attribute__((aligned(64))) = {1, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};

/* `step_ids`: the process's step ids, an endless iterator over G.next_step_id. */
typedef struct {
    PyObject_HEAD
} StepIds;

static PyTypeObject StepIdsType;
static PyObject *the_step_ids; /* the one instance */

typedef struct {
    PyObject_HEAD
    /* what every call reads comes first, so that it shares the fewest cache lines: between two
     * forward passes all of it is out of the CPU caches, and each line fetched costs ~0.1 us */
    vectorcallfunc vectorcall;
    char active;            /* HookHandle.active: cleared by remove() */
    char enabled;           /* Recorder.enabled, kept in step by the recorder's setter */
    char has_last;
    char own_ids;           /* step_ids is the_step_ids: take ids from G, not through a call */
    int fast_kind;          /* 0: general path, 1: list of layers, 2: 4.4x key_cache list */
    PyObject *module;       /* the instrumented nn.Module */
    PyObject *fast_cache;   /* the cache type classified last */
    PyObject *fast_layer;   /* kind 1: the layer type read inline */
    PyObject *hook_dicts;   /* tuple: the module's four hook dicts, then torch's four global ones */
    PyObject *trace_globals; /* torch.jit._trace's globals: `_trace_module_map` */
    StepRows *out;          /* where the rows go */
    PyObject *step_ids;     /* iterator of step ids, shared with the Python paths */
    PyObject *capture_var;  /* ContextVar holding this context's capture list, or None */
    PyObject *last_obj;     /* the last step when the Python path recorded it */
    int64_t last_row[NCOLS];
    /* the rest: slow paths and set-up */
    PyObject *recorder;     /* Recorder: .error(where, exc) */
    PyObject *general;      /* general(module, start_ns, args, kwargs) -> output */
    PyObject *classify;     /* classify(cache) -> (kind, layer type or None) */
    PyObject *sink;         /* the steps sink: .dropped */
    PyObject *reduce_to;    /* a callable returning None: what a pickled slot becomes */
} StepSlot;

static PyObject *s_key_cache, *s_call_impl, *s_error, *s_dropped, *s_where, *s_append;

static inline int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* what time.time_ns() reads */
    return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
}

/* The value of keyword `name`, borrowed, or NULL. */
static HOT PyObject *
kwarg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *name)
{
    if (kwnames == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyTuple_GET_ITEM(kwnames, i) == name)
            return args[nargs + i];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_Check(k) && PyUnicode_Compare(k, name) == 0)
            return args[nargs + i];
    }
    return NULL;
}

/* Two dimensions of `t.shape` into `a` and `b`: the first two when it has exactly two
 * (`input_ids`), else the second to last into `b` when it has at least two (`a` untouched;
 * a cache's key tensor, its sequence axis). `exact2` picks which. Returns 0 on success, -1 on
 * anything else (an error may or may not be set). */
static HOT int
shape_dims(PyObject *t, int exact2, int64_t *a, int64_t *b)
{
    PyObject *sh = PyObject_GetAttr(t, G.shape);
    if (sh == NULL)
        return -1;
    int rc = -1;
    if (PyTuple_Check(sh)) {
        Py_ssize_t n = PyTuple_GET_SIZE(sh);
        if (exact2 ? n == 2 : n >= 2) {
            long long u = exact2 ? PyLong_AsLongLong(PyTuple_GET_ITEM(sh, 0)) : 0;
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, n - 2 + exact2));
            if (!PyErr_Occurred()) {
                if (exact2)
                    *a = (int64_t)u;
                *b = (int64_t)v;
                rc = 0;
            }
        }
    }
    Py_DECREF(sh);
    return rc;
}

/* Whether the call must go through Module._call_impl: 1 when something hooks the module or
 * torch.jit.trace_module is recording module scopes, 0 when calling forward directly is what
 * _call_impl would do, -1 on error.
 *
 * The hook dicts are the module's own objects, taken at install: torch mutates them in place
 * (register_*_hook, handle.remove()) and creates them only in Module.__init__ / __setstate__, so
 * no lookup is needed per call.
 *
 * Tracing: without hooks _call_impl calls `_slow_forward` when torch._C._get_tracing_state() is
 * set, and `_slow_forward` differs from `forward` only by the scope it pushes, which it does only
 * while `torch.jit._trace._trace_module_map` is not None (trace_module and the TorchScript ONNX
 * exporter set it for their duration). So that global, one dictionary lookup, decides the same
 * as torch does. Asking for the tracing state itself is a pybind11 call whose cold code made
 * every step's entry (model(...) to the first line of forward) ~0.8 us slower than this lookup,
 * side by side in the same processes between real forward passes (benchmarks/RESULTS.md). */
static HOT int
hooked(StepSlot *s)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(s->hook_dicts); i++)
        if (PyDict_GET_SIZE(PyTuple_GET_ITEM(s->hook_dicts, i)) != 0)
            return 1;
    PyObject *map = PyDict_GetItemWithError(s->trace_globals, G.trace_module_map); /* borrowed */
    if (map == NULL)
        return PyErr_Occurred() ? -1 : 1; /* gone: _call_impl, and torch, decide */
    return map != Py_None;
}

/* module.forward(*args, **kwargs), or module._call_impl(...) when hooks or trace scopes need it. */
static HOT HOT_PAGE PyObject *
call_module(StepSlot *s, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    int h = hooked(s);
    if (h < 0)
        return NULL;
    PyObject *name = h ? s_call_impl : G.forward;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    /* [spare, module, args..., kwargs...]: the spare slot is ours to lend onwards */
    PyObject *small[16];
    PyObject **stack = small;
    if (total + 2 > 16) {
        stack = PyMem_Malloc((size_t)(total + 2) * sizeof(PyObject *));
        if (stack == NULL)
            return PyErr_NoMemory();
    }
    stack[1] = s->module;
    memcpy(stack + 2, args, (size_t)total * sizeof(PyObject *));
    PyObject *out = PyObject_VectorcallMethod(name, stack + 1, (size_t)(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                              kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return out;
}

/* The Python general path: general(module, start_ns, args, kwargs). */
static COLD PyObject *
call_general(StepSlot *s, int64_t start, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *tuple = NULL, *dict = NULL, *st = NULL, *out = NULL;
    if ((tuple = PyTuple_New(nargs)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    if ((dict = PyDict_New()) == NULL)
        goto done;
    if (kwnames != NULL)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(dict, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
                goto done;
    if ((st = PyLong_FromLongLong(start)) == NULL)
        goto done;
    out = PyObject_CallFunctionObjArgs(s->general, s->module, st, tuple, dict, NULL);
done:
    Py_XDECREF(tuple);
    Py_XDECREF(dict);
    Py_XDECREF(st);
    return out;
}

/* Hand the pending exception to recorder.error("torch_hooks", exc); never raises. */
static COLD void
count_error(StepSlot *s)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *value = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    if (value != NULL) {
        PyObject *r = PyObject_CallMethodObjArgs(s->recorder, s_error, s_where, value, NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    Py_XDECREF(value);
}

static COLD int
add_dropped(StepSlot *s, Py_ssize_t n)
{
    PyObject *d = PyObject_GetAttr(s->sink, s_dropped);
    if (d == NULL)
        return -1;
    PyObject *k = PyLong_FromSsize_t(n);
    PyObject *sum = k ? PyNumber_Add(d, k) : NULL;
    Py_DECREF(d);
    Py_XDECREF(k);
    if (sum == NULL)
        return -1;
    int r = PyObject_SetAttr(s->sink, s_dropped, sum);
    Py_DECREF(sum);
    return r;
}

/* Append one row to the buffer; 1 appended, 0 full (not counted here), -1 out of memory. */
static HOT int
append_row(StepRows *s, const int64_t *row)
{
    if (s->rows >= s->max_rows)
        return 0;
    if (s->rows == s->alloc_rows) {
        Py_ssize_t want = s->alloc_rows ? s->alloc_rows * 2 : 256;
        if (want > s->max_rows)
            want = s->max_rows;
        int64_t *b = PyMem_Realloc(s->buf, (size_t)want * NCOLS * sizeof(int64_t));
        if (b == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->buf = b;
        s->alloc_rows = want;
    }
    memcpy(s->buf + s->rows * NCOLS, row, sizeof(int64_t) * NCOLS);
    s->rows++;
    return 1;
}

static COLD PyObject *
row_tuple(const int64_t *row)
{
    PyObject *t = PyTuple_New(NCOLS);
    if (t == NULL)
        return NULL;
    for (int i = 0; i < NCOLS; i++) {
        PyObject *v = i == NCOLS - 1 ? PyBool_FromLong((long)row[i]) : PyLong_FromLongLong(row[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* The step after the call: id, last step, buffer, capture. Errors are counted, not raised. */
static HOT void
record(StepSlot *s, int64_t start, int64_t end, int64_t batch, int64_t q, int64_t past)
{
    long long sid;
    if (s->own_ids)
        sid = G.next_step_id++;
    else { /* another iterator (a test's): ask it */
        PyObject *id = PyIter_Next(s->step_ids);
        if (id == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "step ids ran out");
            goto error;
        }
        sid = PyLong_AsLongLong(id);
        Py_DECREF(id);
        if (sid == -1 && PyErr_Occurred())
            goto error;
    }
    int64_t row[NCOLS] = {(int64_t)sid, start, end, batch, q, past + q, (q > 1 || past == 0) ? 1 : 0};
    memcpy(s->last_row, row, sizeof row);
    s->has_last = 1;
    int a = append_row(s->out, row); /* before anything below can run Python code */
    if (a < 0)
        goto error;
    Py_CLEAR(s->last_obj);
    if (a == 0 && add_dropped(s, 1) < 0)
        goto error;
    if (G.capturing) { /* some thread is inside capture(): is it this one? */
        PyObject *cap = NULL;
        if (PyContextVar_Get(s->capture_var, Py_None, &cap) < 0)
            goto error;
        if (cap != Py_None) { /* capture() sets a list; anything else is asked to append */
            PyObject *t = row_tuple(row);
            int r = -1;
            if (t != NULL && PyList_CheckExact(cap))
                r = PyList_Append(cap, t);
            else if (t != NULL) {
                PyObject *res = PyObject_CallMethodObjArgs(cap, s_append, t, NULL);
                r = res == NULL ? -1 : 0;
                Py_XDECREF(res);
            }
            Py_XDECREF(t);
            if (r < 0) {
                Py_DECREF(cap);
                goto error;
            }
        }
        Py_XDECREF(cap);
    }
    return;
error:
    count_error(s);
}

/* A cache type seen first: ask Python's classify(cache) how to read it. 0, or -1 for the general
 * path. */
static COLD int
learn_cache(StepSlot *s, PyObject *cache)
{
    PyObject *r = PyObject_CallOneArg(s->classify, cache);
    if (r == NULL)
        return -1;
    int kind = -1;
    PyObject *layer = NULL;
    if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
        kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(r, 0));
        layer = PyTuple_GET_ITEM(r, 1);
    }
    if (kind < 0 || kind > 2 || (kind == 1 && !PyType_Check(layer))) {
        Py_DECREF(r);
        return -1;
    }
    Py_INCREF(Py_TYPE(cache));
    Py_XSETREF(s->fast_cache, (PyObject *)Py_TYPE(cache));
    Py_XINCREF(kind == 1 ? layer : NULL);
    Py_XSETREF(s->fast_layer, kind == 1 ? layer : NULL);
    s->fast_kind = kind;
    Py_DECREF(r);
    return 0;
}

static HOT PyObject *
slot_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    StepSlot *s = (StepSlot *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (s->module == NULL) { /* cleared by the garbage collector: nothing left to call */
        PyErr_SetString(PyExc_RuntimeError, "tracetool step slot called after it was cleared");
        return NULL;
    }
    if (!s->active || !s->enabled)
        return call_module(s, args, nargsf, kwnames);
    int64_t start = now_ns();
    int64_t batch, q, past = 0;
    PyObject *x = nargs ? args[0] : kwarg(args, nargs, kwnames, G.input_ids);
    if (x == NULL || shape_dims(x, 1, &batch, &q) < 0)
        goto general;
    PyObject *cache = kwarg(args, nargs, kwnames, G.cache);
    if (cache == NULL || cache == Py_None)
        cache = kwarg(args, nargs, kwnames, G.past_key_values);
    if (cache == NULL)
        goto general;
    if ((PyObject *)Py_TYPE(cache) != s->fast_cache && learn_cache(s, cache) < 0)
        goto general;
    if (s->fast_kind == 1) { /* transformers >= 4.56 / 5.x: a list of layers */
        PyObject *layers = PyObject_GetAttr(cache, G.layers);
        if (layers == NULL)
            goto general;
        if (!PyList_Check(layers) || PyList_GET_SIZE(layers) == 0
            || (PyObject *)Py_TYPE(PyList_GET_ITEM(layers, 0)) != s->fast_layer) {
            Py_DECREF(layers);
            goto general;
        }
        PyObject *l0 = PyList_GET_ITEM(layers, 0);
        Py_INCREF(l0);
        Py_DECREF(layers);
        /* A layer's `keys` is None until its first update (and after reset() in 5.x), which is
         * when get_seq_length() answers 0; `is_initialized` says the same in >= 4.57 and does not
         * exist in 4.56, so it is not read (one attribute fewer: ~0.3 us per step when cold). */
        PyObject *keys = PyObject_GetAttr(l0, G.keys);
        int bad = keys == NULL || (keys != Py_None && shape_dims(keys, 0, NULL, &past) < 0);
        Py_XDECREF(keys);
        Py_DECREF(l0);
        if (bad)
            goto general;
    }
    else if (s->fast_kind == 2) { /* 4.4x DynamicCache: what its get_seq_length() reads */
        PyObject *kc = PyObject_GetAttr(cache, s_key_cache);
        if (kc == NULL)
            goto general;
        int bad = !PyList_Check(kc);
        if (!bad && PyList_GET_SIZE(kc) > 0) {
            PyObject *sh = PyObject_GetAttr(PyList_GET_ITEM(kc, 0), G.shape);
            bad = sh == NULL || !PyTuple_Check(sh);
            if (!bad && PyTuple_GET_SIZE(sh) > 1) { /* empty layers are 1-D placeholders */
                long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, PyTuple_GET_SIZE(sh) - 2));
                bad = v == -1 && PyErr_Occurred();
                past = (int64_t)v;
            }
            Py_XDECREF(sh);
        }
        Py_DECREF(kc);
        if (bad)
            goto general;
    }
    else
        goto general;

    PyObject *out = call_module(s, args, nargsf, kwnames);
    if (out == NULL)
        return NULL; /* the model's own exception, unchanged */
    record(s, start, now_ns(), batch, q, past);
    return out;

general:
    PyErr_Clear();
    return call_general(s, start, args, nargs, kwnames);
}

/* -- Python-visible methods ------------------------------------------------------------------ */

static PyObject *
ids_next(StepIds *Py_UNUSED(s))
{
    return PyLong_FromLongLong(G.next_step_id++);
}

static PyTypeObject StepIdsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectors.torch_hooks._cstep.StepIds",
    .tp_doc = "The process's step ids (the module's `step_ids`): an endless iterator counted in C.",
    .tp_basicsize = sizeof(StepIds),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ids_next,
};

static PyObject *
rows_take(StepRows *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *b = PyBytes_FromStringAndSize((const char *)s->buf, s->rows * NCOLS * (Py_ssize_t)sizeof(int64_t));
    if (b == NULL)
        return NULL;
    s->rows = 0;
    if (s->alloc_rows > 65536) { /* a burst grew it: give the memory back */
        PyMem_Free(s->buf);
        s->buf = NULL;
        s->alloc_rows = 0;
    }
    return b;
}

static PyObject *
rows_push(StepRows *s, PyObject *raw)
{
    PyObject *seq = PySequence_Fast(raw, "a step row is a sequence of 7 ints");
    if (seq == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != NCOLS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "a step row has 7 values");
        return NULL;
    }
    int64_t row[NCOLS];
    for (int i = 0; i < NCOLS; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        row[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    int a = append_row(s, row);
    if (a < 0)
        return NULL;
    return PyBool_FromLong(a);
}

static Py_ssize_t
rows_len(PyObject *op)
{
    return ((StepRows *)op)->rows;
}

static PyObject *
rows_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"max_rows", NULL};
    Py_ssize_t max_rows;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:StepRows", names, &max_rows))
        return NULL;
    if (max_rows < 0 || max_rows > PY_SSIZE_T_MAX / (NCOLS * (Py_ssize_t)sizeof(int64_t))) {
        PyErr_SetString(PyExc_ValueError, "max_rows out of range");
        return NULL;
    }
    StepRows *s = (StepRows *)type->tp_alloc(type, 0);
    if (s != NULL)
        s->max_rows = max_rows;
    return (PyObject *)s;
}

static void
rows_dealloc(StepRows *s)
{
    PyMem_Free(s->buf);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
rows_get_max(StepRows *s, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(s->max_rows);
}

static PyMethodDef rows_methods[] = {
    {"take", (PyCFunction)rows_take, METH_NOARGS,
     "take() -> bytes: the pending rows (7 native int64 each), removed from the buffer."},
    {"push", (PyCFunction)rows_push, METH_O,
     "push(row) -> bool: append a row of 7 ints (the Python paths); False when max_rows are pending."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef rows_getset[] = {
    {"max_rows", (getter)rows_get_max, NULL, "Rows held at most; more are refused (and counted as dropped).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods rows_as_sequence = {.sq_length = rows_len};

static PyTypeObject StepRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectors.torch_hooks._cstep.StepRows",
    .tp_doc = "StepRows(max_rows): step rows waiting for the writer, 7 int64 each (see _cstep.c).",
    .tp_basicsize = sizeof(StepRows),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = rows_new,
    .tp_dealloc = (destructor)rows_dealloc,
    .tp_methods = rows_methods,
    .tp_getset = rows_getset,
    .tp_as_sequence = &rows_as_sequence,
};

static PyObject *
slot_get_last(StepSlot *s, void *Py_UNUSED(closure))
{
    if (s->last_obj != NULL)
        return Py_NewRef(s->last_obj);
    if (s->has_last)
        return row_tuple(s->last_row);
    Py_RETURN_NONE;
}

static int
slot_set_last(StepSlot *s, PyObject *value, void *Py_UNUSED(closure))
{
    Py_XSETREF(s->last_obj, (value == NULL || value == Py_None) ? NULL : Py_NewRef(value));
    s->has_last = 0;
    return 0;
}

static PyObject *
slot_deepcopy(StepSlot *Py_UNUSED(s), PyObject *Py_UNUSED(memo))
{
    Py_RETURN_NONE; /* a deep-copied model is not instrumented: its copy runs untimed */
}

static PyObject *
slot_reduce(StepSlot *s, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(O())", s->reduce_to); /* nor is a pickled one */
}

static PyObject *
slot_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"module", "recorder", "general", "classify", "trace_globals", "hook_dicts",
                            "step_ids", "capture_var", "sink", "reduce_to", "out", "enabled", NULL};
    PyObject *o[10], *out;
    int enabled;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO!O!OO!OOO!p:StepSlot", names, &o[0], &o[1], &o[2],
                                     &o[3], &PyDict_Type, &o[4], &PyTuple_Type, &o[5], &o[6], &PyContextVar_Type, &o[7],
                                     &o[8], &o[9], &StepRowsType, &out, &enabled))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(o[5]); i++)
        if (!PyDict_Check(PyTuple_GET_ITEM(o[5], i))) {
            PyErr_SetString(PyExc_TypeError, "hook_dicts holds dicts");
            return NULL;
        }
    StepSlot *s = (StepSlot *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    PyObject **fields[10] = {&s->module, &s->recorder, &s->general, &s->classify, &s->trace_globals,
                             &s->hook_dicts, &s->step_ids, &s->capture_var, &s->sink, &s->reduce_to};
    for (int i = 0; i < 10; i++)
        *fields[i] = Py_NewRef(o[i]);
    s->out = (StepRows *)Py_NewRef(out);
    s->own_ids = s->step_ids == the_step_ids;
    s->active = 1;
    s->enabled = (char)enabled;
    s->vectorcall = slot_vectorcall;
    return (PyObject *)s;
}

static int
slot_traverse(StepSlot *s, visitproc visit, void *arg)
{
    Py_VISIT(s->out);
    Py_VISIT(s->module);
    Py_VISIT(s->recorder);
    Py_VISIT(s->general);
    Py_VISIT(s->classify);
    Py_VISIT(s->trace_globals);
    Py_VISIT(s->hook_dicts);
    Py_VISIT(s->step_ids);
    Py_VISIT(s->capture_var);
    Py_VISIT(s->sink);
    Py_VISIT(s->reduce_to);
    Py_VISIT(s->fast_cache);
    Py_VISIT(s->fast_layer);
    Py_VISIT(s->last_obj);
    return 0;
}

static int
slot_clear(StepSlot *s)
{
    Py_CLEAR(s->out);
    Py_CLEAR(s->module);
    Py_CLEAR(s->recorder);
    Py_CLEAR(s->general);
    Py_CLEAR(s->classify);
    Py_CLEAR(s->trace_globals);
    Py_CLEAR(s->hook_dicts);
    Py_CLEAR(s->step_ids);
    Py_CLEAR(s->capture_var);
    Py_CLEAR(s->sink);
    Py_CLEAR(s->reduce_to);
    Py_CLEAR(s->fast_cache);
    Py_CLEAR(s->fast_layer);
    Py_CLEAR(s->last_obj);
    return 0;
}

static void
slot_dealloc(StepSlot *s)
{
    PyObject_GC_UnTrack(s);
    slot_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyMethodDef slot_methods[] = {
    {"__deepcopy__", (PyCFunction)slot_deepcopy, METH_O, NULL},
    {"__reduce__", (PyCFunction)slot_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef slot_members[] = {
    {"active", T_BOOL, offsetof(StepSlot, active), 0, "False once the handle is removed: calls pass through."},
    {"enabled", T_BOOL, offsetof(StepSlot, enabled), 0, "The recorder's enabled flag (its setter keeps it)."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef slot_getset[] = {
    {"last", (getter)slot_get_last, (setter)slot_set_last,
     "The last step recorded through this slot: a 7-tuple, what the Python path set, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StepSlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collectors.torch_hooks._cstep.StepSlot",
    .tp_doc = "The step timing slot of collectors.torch_hooks.instrument(), in C (see _cstep.c).",
    .tp_basicsize = sizeof(StepSlot),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = slot_new,
    .tp_dealloc = (destructor)slot_dealloc,
    .tp_traverse = (traverseproc)slot_traverse,
    .tp_clear = (inquiry)slot_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StepSlot, vectorcall),
    .tp_methods = slot_methods,
    .tp_getset = slot_getset,
    .tp_members = slot_members,
};

static struct PyModuleDef cstep_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "collectors.torch_hooks._cstep",
    .m_doc = "The step timing slot of collectors.torch_hooks.instrument(), in C.",
    .m_size = -1,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;

/* Add `obj` (a new reference, or NULL after an error) to the module as `name`. */
static int
add(PyObject *m, const char *name, PyObject *obj)
{
    if (obj == NULL)
        return -1;
    if (PyModule_AddObject(m, name, obj) < 0) {
        Py_DECREF(obj);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__cstep(void)
{
    INTERN(G.input_ids, "input_ids");
    INTERN(G.cache, "cache");
    INTERN(G.past_key_values, "past_key_values");
    INTERN(G.shape, "shape");
    INTERN(G.layers, "layers");
    INTERN(G.keys, "keys");
    INTERN(s_key_cache, "key_cache");
    INTERN(G.forward, "forward");
    INTERN(G.trace_module_map, "_trace_module_map");
    INTERN(s_call_impl, "_call_impl");
    INTERN(s_error, "error");
    INTERN(s_dropped, "dropped");
    INTERN(s_where, "torch_hooks");
    INTERN(s_append, "append");
    if (PyType_Ready(&StepIdsType) < 0 || PyType_Ready(&StepRowsType) < 0 || PyType_Ready(&StepSlotType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&cstep_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&StepSlotType);
    if (PyModule_AddObject(m, "StepSlot", (PyObject *)&StepSlotType) < 0) {
        Py_DECREF(&StepSlotType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *view = PyMemoryView_FromMemory((char *)&G.capturing, sizeof G.capturing, PyBUF_WRITE);
    PyObject *capturing = view ? PyObject_CallMethod(view, "cast", "s", "q") : NULL;
    Py_XDECREF(view);
    the_step_ids = PyType_GenericAlloc(&StepIdsType, 0);
    if (add(m, "StepRows", Py_NewRef((PyObject *)&StepRowsType)) < 0
        || add(m, "step_ids", the_step_ids ? Py_NewRef(the_step_ids) : NULL) < 0
        || add(m, "capturing", capturing) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "NCOLS", NCOLS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
