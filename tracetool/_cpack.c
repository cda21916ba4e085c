/*
 * tracetool._cpack: a packed sink's rows -> one Arrow record batch, in C.
 *
 * Why C: a live recording flushes every table ten times a second, a few dozen
 * rows each time. Turning such a flush into a record batch in Python costs
 * ~100 us per table whatever its size (numpy views and null checks, one
 * pyarrow call per column, RecordBatch.from_arrays checking them), about
 * 10 us per generated token on the writer's thread at 430 tok/s
 * (benchmarks/bench_flush.py). Here one pass over the rows
 * builds every column's buffers and hands them to pyarrow through the Arrow C
 * data interface (https://arrow.apache.org/docs/format/CDataInterface.html):
 * one import call, no copy.
 *
 *     pack(rows, ncols, kinds, strings, address) -> number of rows
 *
 * rows: a buffer of int64s, row after row (PackedSink's array('q')); kinds: one
 * byte per column, b'l' int64, b'i' int32, b's' string (an interner code);
 * strings: the interner's {code: str}; address: where to write the struct
 * ArrowArray (a struct array of the columns) that
 * pyarrow.RecordBatch._import_from_c(address, schema) then takes over.
 *
 * The same values as the Python path (tracetool.writer.PackedSink): INT_NULL
 * is null, an int32 column's value that does not fit is null (not wrapped), a
 * code the interner no longer has is null. Anything this cannot do (a string
 * that is not valid UTF-8, 2 GiB of text) raises, and the caller takes the
 * Python path for that flush. It runs with the GIL held from start to end, so
 * the interner's dict cannot change under it.
 *
 *     pack_tuples(rows, kinds, address) -> number of rows
 *
 * does the same for a list of row tuples of Python values (RowSink's rows, the
 * tables with float columns, gpu): kinds as above plus b'd' float64, b's' a str
 * itself; None is null. A value of another type (a numpy scalar, a float in an
 * int column, an int32 that does not fit) raises, and the Python path, which
 * coerces what it can, does that flush.
 *
 *     release(address)
 *
 * releases a struct that was not imported (an import that failed).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INT_NULL INT64_MIN

/* The Arrow C data interface's array struct (ABI-stable, from the specification). */
struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* One column: its struct, its buffer pointers and the memory they point to. */
typedef struct {
    struct ArrowArray array;
    const void *buffers[3];
    void *owned[3];
} Column;

/* The batch: the parent struct array's private data. */
typedef struct {
    Py_ssize_t ncols;
    const void *parent_buffers[1];
    struct ArrowArray **child_ptrs;
    Column *cols;
} Batch;

static void
release_child(struct ArrowArray *a)
{
    /* a child's memory belongs to its parent's Batch, freed there */
    a->release = NULL;
}

static void
free_batch(Batch *b)
{
    if (b == NULL)
        return;
    if (b->cols != NULL)
        for (Py_ssize_t j = 0; j < b->ncols; j++)
            for (int k = 0; k < 3; k++)
                free(b->cols[j].owned[k]);
    free(b->cols);
    free(b->child_ptrs);
    free(b);
}

static void
release_batch(struct ArrowArray *a)
{
    Batch *b = (Batch *)a->private_data;
    for (Py_ssize_t j = 0; j < b->ncols; j++)
        if (b->cols[j].array.release != NULL)
            b->cols[j].array.release(&b->cols[j].array);
    free_batch(b);
    a->release = NULL;
}

/* A validity bitmap for n rows, all valid; NULL when out of memory. */
static uint8_t *
new_bitmap(Py_ssize_t n)
{
    size_t bytes = (size_t)(n + 7) / 8;
    uint8_t *bits = malloc(bytes ? bytes : 1);
    if (bits != NULL)
        memset(bits, 0xff, bytes ? bytes : 1);
    return bits;
}

static int
int_column(Column *c, const int64_t *rows, Py_ssize_t n, Py_ssize_t ncols, Py_ssize_t j, int narrow)
{
    size_t width = narrow ? 4 : 8;
    void *data = malloc(n ? (size_t)n * width : 1);
    uint8_t *bits = new_bitmap(n);
    if (data == NULL || bits == NULL) {
        free(data);
        free(bits);
        PyErr_NoMemory();
        return -1;
    }
    int64_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = rows[i * ncols + j];
        int valid = v != INT_NULL && (!narrow || (v >= INT32_MIN && v <= INT32_MAX));
        if (!valid) {
            nulls++;
            bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
            v = 0;
        }
        if (narrow)
            ((int32_t *)data)[i] = (int32_t)v;
        else
            ((int64_t *)data)[i] = v;
    }
    if (nulls == 0) { /* no bitmap at all, as the Python path builds it */
        free(bits);
        bits = NULL;
    }
    c->owned[0] = bits;
    c->owned[1] = data;
    c->buffers[0] = bits;
    c->buffers[1] = data;
    c->array.n_buffers = 2;
    c->array.null_count = nulls;
    return 0;
}

static int
string_column(Column *c, const int64_t *rows, Py_ssize_t n, Py_ssize_t ncols, Py_ssize_t j, PyObject *strings)
{
    const char **ptrs = malloc(n ? (size_t)n * sizeof(char *) : 1);
    Py_ssize_t *lens = malloc(n ? (size_t)n * sizeof(Py_ssize_t) : 1);
    int32_t *offsets = malloc((size_t)(n + 1) * sizeof(int32_t));
    uint8_t *bits = new_bitmap(n);
    char *data = NULL;
    if (ptrs == NULL || lens == NULL || offsets == NULL || bits == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t nulls = 0;
    size_t total = 0;
    int64_t last_code = INT_NULL;
    const char *last_ptr = NULL;
    Py_ssize_t last_len = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t code = rows[i * ncols + j];
        const char *p = NULL;
        Py_ssize_t len = -1;
        if (code != INT_NULL && code == last_code) {
            p = last_ptr;
            len = last_len;
        }
        else if (code != INT_NULL) {
            PyObject *key = PyLong_FromLongLong(code);
            if (key == NULL)
                goto fail;
            PyObject *s = PyDict_GetItemWithError(strings, key); /* borrowed */
            Py_DECREF(key);
            if (s == NULL && PyErr_Occurred())
                goto fail;
            if (s != NULL) {
                if (!PyUnicode_Check(s)) {
                    PyErr_SetString(PyExc_TypeError, "an interned value is not a str");
                    goto fail;
                }
                p = PyUnicode_AsUTF8AndSize(s, &len); /* cached in the str; lives as long as it */
                if (p == NULL)
                    goto fail;
            }
            last_code = code;
            last_ptr = p;
            last_len = len;
        }
        if (p == NULL) { /* null, or forgotten by the interner */
            nulls++;
            bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
            len = 0;
        }
        ptrs[i] = p;
        lens[i] = len;
        total += (size_t)len;
        if (total > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of strings in one batch");
            goto fail;
        }
    }
    data = malloc(total ? total : 1);
    if (data == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    size_t at = 0;
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (lens[i] > 0)
            memcpy(data + at, ptrs[i], (size_t)lens[i]);
        at += (size_t)lens[i];
        offsets[i + 1] = (int32_t)at;
    }
    free(ptrs);
    free(lens);
    if (nulls == 0) {
        free(bits);
        bits = NULL;
    }
    c->owned[0] = bits;
    c->owned[1] = offsets;
    c->owned[2] = data;
    c->buffers[0] = bits;
    c->buffers[1] = offsets;
    c->buffers[2] = data;
    c->array.n_buffers = 3;
    c->array.null_count = nulls;
    return 0;
fail:
    free(ptrs);
    free(lens);
    free(offsets);
    free(bits);
    free(data);
    return -1;
}

static Batch *new_batch(Py_ssize_t ncols);
static void finish_column(Batch *b, Py_ssize_t j, Py_ssize_t n);
static void export_batch(Batch *b, Py_ssize_t n, unsigned long long address);

static PyObject *
pack(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    Py_ssize_t ncols;
    const char *kinds;
    Py_ssize_t nkinds;
    PyObject *strings;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "y*ny#O!K:pack", &view, &ncols, &kinds, &nkinds, &PyDict_Type, &strings, &address))
        return NULL;
    Batch *b = NULL;
    if (ncols <= 0 || nkinds != ncols || view.len % (Py_ssize_t)(ncols * sizeof(int64_t)) != 0 || address == 0) {
        PyErr_SetString(PyExc_ValueError, "pack: rows, ncols and kinds do not agree");
        goto fail;
    }
    Py_ssize_t n = view.len / (Py_ssize_t)(ncols * sizeof(int64_t));
    const int64_t *rows = (const int64_t *)view.buf;
    if ((b = new_batch(ncols)) == NULL)
        goto fail;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        Column *c = &b->cols[j];
        int rc;
        if (kinds[j] == 's')
            rc = string_column(c, rows, n, ncols, j, strings);
        else if (kinds[j] == 'l' || kinds[j] == 'i')
            rc = int_column(c, rows, n, ncols, j, kinds[j] == 'i');
        else {
            PyErr_Format(PyExc_ValueError, "pack: unknown column kind %c", kinds[j]);
            rc = -1;
        }
        if (rc < 0)
            goto fail;
        finish_column(b, j, n);
    }
    export_batch(b, n, address);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
fail:
    free_batch(b);
    PyBuffer_Release(&view);
    return NULL;
}

/* Column j of a list of row tuples (RowSink's rows): b'l'/b'i' an int (int32: must fit), b'd' a
 * float (an int or anything with __float__ too), b's' a str; None is null. Anything else raises,
 * and the caller takes the Python path, which coerces what it can. */
static int
object_column(Column *c, PyObject *rows, Py_ssize_t n, Py_ssize_t j, char kind)
{
    size_t width = kind == 'i' ? 4 : 8;
    int32_t *offsets = NULL;
    char *data = NULL;
    void *values = NULL;
    uint8_t *bits = new_bitmap(n);
    size_t total = 0, cap = 0;
    if (kind == 's') {
        offsets = malloc((size_t)(n + 1) * sizeof(int32_t));
        cap = 64;
        data = malloc(cap);
        if (offsets != NULL)
            offsets[0] = 0;
    }
    else
        values = malloc(n ? (size_t)n * width : 1);
    if (bits == NULL || (kind == 's' ? (offsets == NULL || data == NULL) : values == NULL)) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(PyList_GET_ITEM(rows, i), j);
        if (v == Py_None) {
            nulls++;
            bits[i >> 3] &= (uint8_t)~(1u << (i & 7));
            if (kind == 's')
                offsets[i + 1] = (int32_t)total;
            else if (kind == 'd')
                ((double *)values)[i] = 0.0;
            else if (kind == 'i')
                ((int32_t *)values)[i] = 0;
            else
                ((int64_t *)values)[i] = 0;
            continue;
        }
        if (kind == 'd') {
            double d = PyFloat_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred())
                goto fail;
            ((double *)values)[i] = d;
        }
        else if (kind == 'l' || kind == 'i') {
            if (!PyLong_Check(v)) { /* a float, a numpy scalar: the Python path decides */
                PyErr_SetString(PyExc_TypeError, "not an int");
                goto fail;
            }
            long long x = PyLong_AsLongLong(v);
            if (x == -1 && PyErr_Occurred())
                goto fail;
            if (kind == 'i') {
                if (x < INT32_MIN || x > INT32_MAX) {
                    PyErr_SetString(PyExc_OverflowError, "does not fit an int32");
                    goto fail;
                }
                ((int32_t *)values)[i] = (int32_t)x;
            }
            else
                ((int64_t *)values)[i] = (int64_t)x;
        }
        else { /* 's' */
            if (!PyUnicode_Check(v)) {
                PyErr_SetString(PyExc_TypeError, "not a str");
                goto fail;
            }
            Py_ssize_t len;
            const char *u = PyUnicode_AsUTF8AndSize(v, &len);
            if (u == NULL)
                goto fail;
            if (total + (size_t)len > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of strings in one batch");
                goto fail;
            }
            if (total + (size_t)len > cap) {
                while (total + (size_t)len > cap)
                    cap *= 2;
                char *grown = realloc(data, cap);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                data = grown;
            }
            memcpy(data + total, u, (size_t)len);
            total += (size_t)len;
            offsets[i + 1] = (int32_t)total;
        }
    }
    if (nulls == 0) {
        free(bits);
        bits = NULL;
    }
    c->owned[0] = bits;
    c->buffers[0] = bits;
    if (kind == 's') {
        c->owned[1] = offsets;
        c->owned[2] = data;
        c->buffers[1] = offsets;
        c->buffers[2] = data;
        c->array.n_buffers = 3;
    }
    else {
        c->owned[1] = values;
        c->buffers[1] = values;
        c->array.n_buffers = 2;
    }
    c->array.null_count = nulls;
    return 0;
fail:
    free(bits);
    free(offsets);
    free(data);
    free(values);
    return -1;
}

/* The parent struct array over b's columns, written at `address`. */
static void
export_batch(Batch *b, Py_ssize_t n, unsigned long long address)
{
    b->parent_buffers[0] = NULL;
    struct ArrowArray *out = (struct ArrowArray *)(uintptr_t)address;
    out->length = n;
    out->null_count = 0;
    out->offset = 0;
    out->n_buffers = 1;
    out->n_children = b->ncols;
    out->buffers = b->parent_buffers;
    out->children = b->child_ptrs;
    out->dictionary = NULL;
    out->private_data = b;
    out->release = release_batch;
}

static Batch *
new_batch(Py_ssize_t ncols)
{
    Batch *b = calloc(1, sizeof(Batch));
    if (b == NULL || (b->cols = calloc((size_t)ncols, sizeof(Column))) == NULL
        || (b->child_ptrs = calloc((size_t)ncols, sizeof(struct ArrowArray *))) == NULL) {
        free_batch(b);
        PyErr_NoMemory();
        return NULL;
    }
    b->ncols = ncols;
    return b;
}

static void
finish_column(Batch *b, Py_ssize_t j, Py_ssize_t n)
{
    Column *c = &b->cols[j];
    c->array.length = n;
    c->array.buffers = c->buffers;
    c->array.release = release_child;
    b->child_ptrs[j] = &c->array;
}

static PyObject *
pack_tuples(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *rows;
    const char *kinds;
    Py_ssize_t ncols;
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "O!y#K:pack_tuples", &PyList_Type, &rows, &kinds, &ncols, &address))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(rows);
    if (ncols <= 0 || address == 0) {
        PyErr_SetString(PyExc_ValueError, "pack_tuples: no columns");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != ncols) {
            PyErr_SetString(PyExc_ValueError, "pack_tuples: a row is not a tuple of the table's width");
            return NULL;
        }
    }
    Batch *b = new_batch(ncols);
    if (b == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < ncols; j++) {
        if (strchr("lids", kinds[j]) == NULL || kinds[j] == '\0') {
            PyErr_Format(PyExc_ValueError, "pack_tuples: unknown column kind %c", kinds[j]);
            goto fail;
        }
        if (object_column(&b->cols[j], rows, n, j, kinds[j]) < 0)
            goto fail;
        finish_column(b, j, n);
    }
    export_batch(b, n, address);
    return PyLong_FromSsize_t(n);
fail:
    free_batch(b);
    return NULL;
}

static PyObject *
release(PyObject *Py_UNUSED(module), PyObject *arg)
{
    unsigned long long address = PyLong_AsUnsignedLongLong(arg);
    if (address == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    struct ArrowArray *a = (struct ArrowArray *)(uintptr_t)address;
    if (a != NULL && a->release != NULL)
        a->release(a);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS, "pack(rows, ncols, kinds, strings, address) -> rows: see the module's source."},
    {"pack_tuples", pack_tuples, METH_VARARGS,
     "pack_tuples(rows, kinds, address) -> rows: a list of row tuples, see the module's source."},
    {"release", release, METH_O, "release(address): release an ArrowArray that was not imported."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tracetool._cpack",
    "A packed sink's int64 rows to an Arrow record batch through the C data interface.", -1, methods,
};

PyMODINIT_FUNC
PyInit__cpack(void)
{
    return PyModule_Create(&module);
}
