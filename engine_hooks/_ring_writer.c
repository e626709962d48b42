/* Compiled fast path of gatherwise.engine_hooks.recorder.RingRecorder.record(): the same bytes, written by one C call.
 *
 * Optional: built by `pip install` when a C compiler is there; RingRecorder falls back to its pure-Python
 * record() otherwise (GATHERWISE_PURE_PYTHON_RECORDER=1 forces the fallback). The ring format is defined in
 * gatherwise/shm_format/ring.py and docs/shm-format.md; tests/test_recorder_native.py checks that both
 * writers produce identical files for the same calls, saturation included.
 *
 * Why C: inside the logits path the interpreter's work for one record (argument handling, ~60 bytecodes, a
 * struct pack and ten memoryview updates) costs more than the stores themselves once the path's tensor work
 * has evicted it from the caches.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Layout constants; tests/test_recorder_native.py checks them against shm_format/ring.py. */
#define FORMAT_VERSION 2
#define HEADER_SIZE 512
#define RECORD_SIZE 88
#define WRITE_INDEX_OFFSET 56
#define COUNTERS_OFFSET 128
#define NUM_OPS 7
#define ROW_WORDS (1 + 2 * NUM_OPS)
#define NUM_MODE_ROWS 3
#define MODE_GATHER 1
#define OP_ALL_GATHER 0
#define OP_GATHER 1
#define OP_BROADCAST 2
#define OP_SAMPLE 3
#define OP_PATH 4
#define OP_SHARD_EXCHANGE 5
#define OP_SHARD_RESOLVE 6
#define TOPP_ROWS_OFFSET 80
#define TOPP_FALLBACK_ROWS_OFFSET 88
#define FLAG_BROADCAST 1u
#define FLAG_RESOLVE 2u
#define TAG_SHIFT 2
#define TAG_MASK 0x3Fu
#define FALLBACK_SHIFT 8
#define FALLBACK_MAX 0xFFFFFFll
#define BROADCAST_BYTES_PER_ROW 8
#define U32_MAX 0xFFFFFFFFll

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    uint64_t capacity;
    uint32_t vocab;
    uint16_t rank;
    uint8_t dtype;
} Writer;

static inline uint32_t sat32(long long v) { return v < 0 ? 0u : (v > U32_MAX ? (uint32_t)U32_MAX : (uint32_t)v); }
static inline uint64_t pos(long long v) { return v < 0 ? 0u : (uint64_t)v; }

static inline void store32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void store64(char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Header counters are single aligned 8-byte stores (readers may look at any time). */
static inline void add_word(uint64_t *w, uint64_t v) { __atomic_store_n(w, *w + v, __ATOMIC_RELAXED); }

static int Writer_init(Writer *self, PyObject *args, PyObject *kwds) {
    PyObject *buffer;
    unsigned long long capacity;
    unsigned int vocab, rank, dtype;
    if (!PyArg_ParseTuple(args, "OKIII", &buffer, &capacity, &vocab, &rank, &dtype)) return -1;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
    self->has_view = 1;
    if (capacity < 1 || (unsigned long long)self->view.len < HEADER_SIZE + capacity * RECORD_SIZE) {
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring it should hold");
        return -1;
    }
    self->capacity = capacity;
    self->vocab = vocab;
    self->rank = (uint16_t)rank;
    self->dtype = (uint8_t)dtype;
    return 0;
}

static PyObject *Writer_release(Writer *self, PyObject *unused) {
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    Py_RETURN_NONE;
}

static void Writer_dealloc(Writer *self) {
    Writer_release(self, NULL);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* record(call_index, mode, rows, epoch, nbytes, t_start, coll_start, coll_end, bcast_start, bcast_end,
 *        sample_start, sample_end, t_end[, resolve_nbytes, topp_rows, fallback_rows]): exactly
 *        RingRecorder.record(). */
static const char *const RECORD_ARGS[17] = {
    "call_index", "mode", "rows", "epoch", "nbytes", "t_start", "coll_start", "coll_end", "bcast_start",
    "bcast_end", "sample_start", "sample_end", "t_end", "resolve_nbytes", "topp_rows", "fallback_rows", "tag"};

static PyObject *Writer_record(Writer *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    long long a[17] = {0};
    int given[17] = {0};
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 17) {
        PyErr_Format(PyExc_TypeError, "record() takes at most 17 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "record() on a closed ring");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) { /* keywords follow the positionals in args (vectorcall) */
        int slot = (int)i;
        if (i >= nargs) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i - nargs);
            slot = -1;
            for (int k = 0; k < 17; k++) {
                if (PyUnicode_CompareWithASCIIString(name, RECORD_ARGS[k]) == 0) slot = k;
            }
            if (slot < 0 || given[slot]) {
                PyErr_Format(PyExc_TypeError, "record() got an %s keyword argument '%U'",
                             slot < 0 ? "unexpected" : "repeated", name);
                return NULL;
            }
        }
        given[slot] = 1;
        a[slot] = PyLong_AsLongLong(args[i]);
        if (a[slot] == -1 && PyErr_Occurred()) return NULL;
    }
    for (int k = 0; k < 13; k++) {
        if (!given[k]) {
            PyErr_Format(PyExc_TypeError, "record() missing required argument '%s'", RECORD_ARGS[k]);
            return NULL;
        }
    }
    long long call_index = a[0], mode = a[1], rows = a[2], epoch = a[3], nbytes = a[4], t_start = a[5];
    long long coll_start = a[6], coll_end = a[7], bcast_start = a[8], bcast_end = a[9];
    long long sample_start = a[10], sample_end = a[11], t_end = a[12];
    long long resolve_nbytes = a[13], topp_rows = a[14], fallback_rows = a[15], tag = a[16];
    if (mode < 0 || mode >= NUM_MODE_ROWS || rows < 0 || rows > (long long)U32_MAX || epoch < 0 ||
        epoch > (long long)U32_MAX || nbytes < 0 || call_index < 0 || resolve_nbytes < 0 || topp_rows < 0 ||
        fallback_rows < 0 || tag < 0) {
        PyErr_SetString(PyExc_ValueError, "record(): mode, rows, epoch, byte counts or call_index out of range");
        return NULL;
    }
    char *base = (char *)self->view.buf;
    uint64_t *words = (uint64_t *)base;
    uint64_t seq = words[WRITE_INDEX_OFFSET / 8] + 1;
    long long coll_ns = coll_end - coll_start, sample_ns = sample_end - sample_start, path_ns = t_end - t_start;
    long long bcast_off = 0, bcast_ns = 0;
    uint32_t flags = 0;
    if (bcast_start) {
        flags = mode > MODE_GATHER ? FLAG_RESOLVE : FLAG_BROADCAST;
        bcast_off = bcast_start - t_start;
        bcast_ns = bcast_end - bcast_start;
    }
    flags |= ((uint32_t)tag & TAG_MASK) << TAG_SHIFT;
    if (fallback_rows) flags |= (uint32_t)(fallback_rows < FALLBACK_MAX ? fallback_rows : FALLBACK_MAX) << FALLBACK_SHIFT;
    char *r = base + HEADER_SIZE + ((seq - 1) % self->capacity) * RECORD_SIZE;
    store64(r + 0, seq);
    store64(r + 8, (uint64_t)t_start);
    store64(r + 16, (uint64_t)call_index);
    store64(r + 24, (uint64_t)nbytes);
    store32(r + 32, (uint32_t)epoch);
    store32(r + 36, (uint32_t)rows);
    store32(r + 40, self->vocab);
    memcpy(r + 44, &self->rank, 2);
    r[46] = (char)(uint8_t)mode;
    r[47] = (char)self->dtype;
    store32(r + 48, sat32(coll_start - t_start));
    store32(r + 52, sat32(coll_ns));
    store32(r + 56, sat32(bcast_off));
    store32(r + 60, sat32(bcast_ns));
    store32(r + 64, sat32(sample_start - t_start));
    store32(r + 68, sat32(sample_ns));
    store32(r + 72, sat32(path_ns));
    store32(r + 76, flags);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    store64(r + 80, seq);

    uint64_t *row = words + COUNTERS_OFFSET / 8 + ROW_WORDS * mode;
    uint64_t total = (uint64_t)nbytes;
    int op = mode == 0 ? OP_ALL_GATHER : mode == MODE_GATHER ? OP_GATHER : OP_SHARD_EXCHANGE;
    add_word(row, 1);
    add_word(row + 1 + 2 * op, pos(coll_ns));
    add_word(row + 2 + 2 * op, (uint64_t)nbytes);
    if (flags & FLAG_BROADCAST) {
        uint64_t bcast_bytes = ((uint64_t)rows + 1) * BROADCAST_BYTES_PER_ROW;
        add_word(row + 1 + 2 * OP_BROADCAST, pos(bcast_ns));
        add_word(row + 2 + 2 * OP_BROADCAST, bcast_bytes);
        total += bcast_bytes;
    } else if (flags & FLAG_RESOLVE) {
        add_word(row + 1 + 2 * OP_SHARD_RESOLVE, pos(bcast_ns));
        add_word(row + 2 + 2 * OP_SHARD_RESOLVE, (uint64_t)resolve_nbytes);
        total += (uint64_t)resolve_nbytes;
    }
    if (topp_rows) {
        add_word(words + TOPP_ROWS_OFFSET / 8, (uint64_t)topp_rows);
        add_word(words + TOPP_FALLBACK_ROWS_OFFSET / 8, (uint64_t)fallback_rows);
    }
    add_word(row + 1 + 2 * OP_SAMPLE, pos(sample_ns));
    add_word(row + 1 + 2 * OP_PATH, pos(path_ns));
    add_word(row + 2 + 2 * OP_PATH, total);
    /* publish last: readers trust every seq <= write_index */
    __atomic_store_n(words + WRITE_INDEX_OFFSET / 8, seq, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyMethodDef Writer_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Writer_record, METH_FASTCALL | METH_KEYWORDS,
     "Write one call's record and counters (the arguments of RingRecorder.record())."},
    {"release", (PyCFunction)Writer_release, METH_NOARGS, "Release the buffer (before closing the mmap)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gatherwise.engine_hooks._ring_writer.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(buffer, capacity, vocab, rank, dtype_code): record() into a telemetry ring.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ring_writer", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__ring_writer(void) {
    if (PyType_Ready(&WriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&WriterType);
    if (PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0) {
        Py_DECREF(&WriterType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "FORMAT_VERSION", FORMAT_VERSION);
    PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE);
    PyModule_AddIntConstant(m, "RECORD_SIZE", RECORD_SIZE);
    PyModule_AddIntConstant(m, "WRITE_INDEX_OFFSET", WRITE_INDEX_OFFSET);
    PyModule_AddIntConstant(m, "COUNTERS_OFFSET", COUNTERS_OFFSET);
    PyModule_AddIntConstant(m, "NUM_OPS", NUM_OPS);
    PyModule_AddIntConstant(m, "NUM_MODE_ROWS", NUM_MODE_ROWS);
    PyModule_AddIntConstant(m, "TOPP_ROWS_OFFSET", TOPP_ROWS_OFFSET);
    PyModule_AddIntConstant(m, "TAG_SHIFT", TAG_SHIFT);
    return m;
}
