/* multiact._hotpath: the hot path of the generated op functions, in C (issue 41 item 2).

   The functions that multiact/api.py and multiact/torch.py generate call one object of this module first
   (an `Op`, per public function): for a call it can vouch for, it makes the hot path's checks, finds the
   call in the op's hot-path cache (the same dict and the same key as the Python hot path: direction, dtype,
   parameter keys, backend, the `ma.use` scope), and runs the cached native kernel on the arrays' addresses
   through the native extension's entry point (ma_call_unary / ma_call_binary).  For anything else (a miss,
   another backend, a strided or misaligned array, an out= that a check would refuse, an unusual parameter)
   it returns None, and the caller goes on to the Python hot path and the checked path: every error is
   raised by the one place that raises it, and nothing is written before.

   What it vouches for, per form:
   - ma forward  op(x, out, backend, *params): x an ndarray (exact type, C-contiguous, aligned, native byte
     order); out None or an ndarray of x's dtype object and shape, C-contiguous, aligned, writeable, and x
     itself, or owning its memory beside an x that owns its own, or disjoint from x, or the same view
     (checks.check_out's rule); or x a plain CPU torch.Tensor (exact type, strided, contiguous, no negative
     bit) with out None.
   - ma grad    op(dy, x, y, out, backend, *params): dy and x (or y) as above, one dtype, one shape.
   - mt forward op(x, inplace, backend, *params): x a plain CPU tensor, not inplace, outside every tracer,
     functorch transform, torch function or dispatch mode and torch.compile (the caller asked
     torch.compiler.is_dynamo_compiling(), which dynamo folds; this reads torch.compiler's flag); where
     autograd must record the call, it returns the cache's Hit instead (multiact.torch's _Eager runs it).
   A parameter is vouched for as a non-zero float or int (exact types) or, for a choice, a str (each keys as
   itself); +0.0 and -0.0 (keyed apart), NumPy scalars and anything else take the Python path.

   `Native` holds one cached call's C entry (the native backend's ma_call_* and its ma_call block), stored on
   the hot path's Hit as `c` by multiact.hot.remember; `run(native, [u,] x)` runs it on tensors for _Eager.
   The GIL is released around calls of at least RELEASE_WORK units of work (elements x the kernel's cost), as
   NumPy's own loops do above a size; below, releasing and taking it back costs more than the kernel.

   Tensors are read through libtorch's AOTInductor C shim, and results made with it and torch's
   THPVariable_Wrap, where hot.py found them and checked them on probe tensors (set_shim); else through
   their Python attributes and torch.empty_like.  See hot.py for why. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#define MAX_PARAMS 8
#define RELEASE_WORK 16384

typedef void (*call1_fn)(const void *, uintptr_t, uintptr_t, size_t, int);
typedef void (*call2_fn)(const void *, uintptr_t, uintptr_t, uintptr_t, size_t, int);

/* ---- module state (set by setup() and set_torch()) ------------------------------------------------ */

static PyObject *scope_var;     /* registry._scope: the ma.use ContextVar */
static PyObject *config_dict;   /* multiact._config.__dict__ (its "_threads") */
static PyObject *get_threads;   /* multiact._config.get_num_threads */
static PyTypeObject *tensor_type; /* torch.Tensor, once the tensor hot path is ready */
static PyObject *t_compiler, *t_empty_like, *t_strided, *t_is_neg, *t_grad_on, *t_tracing, *t_transforms, *t_fmode, *t_dstack;
static PyObject *s_c, *s_dtype, *s_is_cpu, *s_layout, *s_is_contiguous, *s_is_neg, *s_data_ptr, *s_numel,
    *s_requires_grad, *s_shape, *s_threads, *s_cdata, *s_compiling_flag;

/* ---- Native ------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    void *entry;        /* ma_call_unary or ma_call_binary */
    const void *handle; /* its ma_call block */
    PyObject *keep;     /* what owns the block */
    int arity;          /* 1 or 2 inputs */
    size_t cost;        /* the kernel's cost per element (work units) */
    PyObject *dtype;    /* the dtype of the cached call (its key's) */
} NativeObject;

static PyObject *Native_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    unsigned long long entry, handle, cost;
    int arity;
    PyObject *keep, *dtype;
    static char *names[] = {"entry", "handle", "keep", "arity", "cost", "dtype", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "KKOiKO", names, &entry, &handle, &keep, &arity, &cost, &dtype))
        return NULL;
    if (!entry || !handle || (arity != 1 && arity != 2)) {
        PyErr_SetString(PyExc_ValueError, "Native(entry, handle, keep, arity, cost): a null address or an arity "
                                          "other than 1 or 2");
        return NULL;
    }
    NativeObject *self = (NativeObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->entry = (void *)(uintptr_t)entry;
    self->handle = (const void *)(uintptr_t)handle;
    Py_INCREF(keep);
    self->keep = keep;
    self->arity = arity;
    self->cost = cost ? (size_t)cost : 1;
    Py_INCREF(dtype);
    self->dtype = dtype;
    return (PyObject *)self;
}

static void Native_dealloc(NativeObject *self) {
    Py_XDECREF(self->keep);
    Py_XDECREF(self->dtype);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject NativeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "multiact._hotpath.Native",
    .tp_basicsize = sizeof(NativeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Native(entry, handle, keep, arity, cost, dtype): one cached call's C entry point (addresses as ints).",
    .tp_new = Native_new,
    .tp_dealloc = (destructor)Native_dealloc,
};

/* ---- helpers ------------------------------------------------------------------------------------ */

static int threads(void) {
    PyObject *v = PyDict_GetItemWithError(config_dict, s_threads); /* borrowed */
    if (v && PyLong_CheckExact(v)) {
        long n = PyLong_AsLong(v);
        if (n >= 1 && n <= INT_MAX) return (int)n;
    }
    PyErr_Clear();
    PyObject *r = PyObject_CallNoArgs(get_threads); /* the lazy default, or an error of the environment */
    if (!r) return -1;
    long n = PyLong_AsLong(r);
    Py_DECREF(r);
    if (n < 1 || n > INT_MAX) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "multiact: bad thread count");
        return -1;
    }
    return (int)n;
}

static int run(NativeObject *nat, uintptr_t u, uintptr_t v, uintptr_t y, size_t n) {
    int nt = threads();
    if (nt < 0) return -1;
    if (n * nat->cost >= RELEASE_WORK) {
        Py_BEGIN_ALLOW_THREADS
        if (nat->arity == 1) ((call1_fn)nat->entry)(nat->handle, u, y, n, nt);
        else ((call2_fn)nat->entry)(nat->handle, u, v, y, n, nt);
        Py_END_ALLOW_THREADS
    } else if (nat->arity == 1) {
        ((call1_fn)nat->entry)(nat->handle, u, y, n, nt);
    } else {
        ((call2_fn)nat->entry)(nat->handle, u, v, y, n, nt);
    }
    return 0;
}

/* A parameter the hot path keys as given: a non-zero float or int, or a str for a choice. */
static int param_ok(char kind, PyObject *v) {
    if (kind == 'c') return PyUnicode_CheckExact(v);
    if (PyFloat_CheckExact(v)) return PyFloat_AS_DOUBLE(v) != 0.0;
    if (PyLong_CheckExact(v)) {
        int overflow;
        long long i = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (i == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return overflow == 0 && i != 0; /* huge ints: Python's checks say why they do not fit */
    }
    return 0;
}

/* ---- Op ------------------------------------------------------------------------------------------ */

enum { FORM_FWD, FORM_GRAD, FORM_MT };

/* Each Op remembers the last few keys it found, by the identity of their parts (held, so that no other
   object can take their address), with the hot-path caches' generation: hot.clear() (registry.clear_cache)
   calls invalidate(), and an entry of an older generation is looked up again.  Between clears a key of a
   cache names one kernel call (remember() may store a new Hit for a key, for the same kernel and
   parameters), so a remembered Native stays right. */
#define MEMO 4
static unsigned long generation = 1;

typedef struct {
    unsigned long gen; /* 0: empty */
    PyObject *dir, *dtype, *backend, *prefs, *params[MAX_PARAMS];
    NativeObject *nat;
    PyObject *hit; /* the cache's Hit */
} memo_t;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *cache;  /* the op's hot-path cache (hot.cache(name)) */
    PyObject *dir;    /* "forward" or "backward" */
    PyObject *dir_y;  /* "backward_y" */
    int form, nparams, next;
    char kinds[MAX_PARAMS];
    memo_t memo[MEMO];
} OpObject;

static void memo_clear(OpObject *op, memo_t *m) {
    Py_CLEAR(m->dir);
    Py_CLEAR(m->dtype);
    Py_CLEAR(m->backend);
    Py_CLEAR(m->prefs);
    for (int i = 0; i < op->nparams; i++) Py_CLEAR(m->params[i]);
    Py_CLEAR(m->nat);
    Py_CLEAR(m->hit);
    m->gen = 0;
}

/* The Native of the cached hit for (direction, dtype, *params, backend, scope) as a new reference, or NULL
   (a miss, or a hit the C path does not run; no error set); *hit_out (if given): the Hit, borrowed. */
static NativeObject *lookup(OpObject *op, PyObject *dir, PyObject *dtype, PyObject *const *params,
                            PyObject *backend, int arity, PyObject **hit_out) {
    Py_ssize_t np_ = op->nparams, i;
    PyObject *prefs, *key, *hit, *c;
    if (PyContextVar_Get(scope_var, NULL, &prefs) < 0 || !prefs) {
        PyErr_Clear();
        return NULL;
    }
    for (int k = 0; k < MEMO; k++) {
        memo_t *m = &op->memo[k];
        if (m->gen != generation || m->dir != dir || m->dtype != dtype || m->backend != backend || m->prefs != prefs)
            continue;
        for (i = 0; i < np_ && m->params[i] == params[i]; i++) {
        }
        if (i == np_ && m->nat->arity == arity) {
            Py_DECREF(prefs);
            Py_INCREF(m->nat);
            if (hit_out) *hit_out = m->hit;
            return m->nat;
        }
    }
    key = PyTuple_New(np_ + 4);
    if (!key) {
        Py_DECREF(prefs);
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(dir);
    PyTuple_SET_ITEM(key, 0, dir);
    Py_INCREF(dtype);
    PyTuple_SET_ITEM(key, 1, dtype);
    for (i = 0; i < np_; i++) {
        Py_INCREF(params[i]);
        PyTuple_SET_ITEM(key, 2 + i, params[i]);
    }
    Py_INCREF(backend);
    PyTuple_SET_ITEM(key, 2 + np_, backend);
    Py_INCREF(prefs);
    PyTuple_SET_ITEM(key, 3 + np_, prefs);
    hit = PyDict_GetItemWithError(op->cache, key); /* borrowed */
    Py_DECREF(key);
    c = hit ? PyObject_GetAttr(hit, s_c) : NULL;
    if (!c || Py_TYPE(c) != &NativeType || ((NativeObject *)c)->arity != arity) {
        PyErr_Clear();
        Py_XDECREF(c);
        Py_DECREF(prefs);
        return NULL;
    }
    memo_t *m = &op->memo[op->next];
    op->next = (op->next + 1) % MEMO;
    memo_clear(op, m);
    Py_INCREF(dir);
    m->dir = dir;
    Py_INCREF(dtype);
    m->dtype = dtype;
    Py_INCREF(backend);
    m->backend = backend;
    m->prefs = prefs; /* the reference PyContextVar_Get gave */
    for (i = 0; i < np_; i++) {
        Py_INCREF(params[i]);
        m->params[i] = params[i];
    }
    Py_INCREF(c);
    m->nat = (NativeObject *)c;
    Py_INCREF(hit);
    m->hit = hit;
    m->gen = generation;
    if (hit_out) *hit_out = hit;
    return (NativeObject *)c; /* a new reference: a clear_cache() during the call cannot free it */
}

/* ---- NumPy arrays ---- */

#define DIRECT_FLAGS (NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED)

static int np_direct(PyArrayObject *a) {
    return (PyArray_FLAGS(a) & DIRECT_FLAGS) == DIRECT_FLAGS && PyArray_ISNOTSWAPPED(a);
}

static int same_shape(PyArrayObject *a, PyArrayObject *b) {
    int nd = PyArray_NDIM(a);
    return nd == PyArray_NDIM(b) && memcmp(PyArray_DIMS(a), PyArray_DIMS(b), nd * sizeof(npy_intp)) == 0;
}

/* checks.check_out's overlap rule for C-contiguous arrays of one shape and dtype: out is the input, or
   both own their memory, or their bytes are disjoint, or it is the same view (same address and strides);
   anything else is the checked path's to judge (it raises). */
static int np_separate(PyArrayObject *out, PyArrayObject *a) {
    if (out == a || (PyArray_BASE(out) == NULL && PyArray_BASE(a) == NULL)) return 1;
    char *o = PyArray_BYTES(out), *p = PyArray_BYTES(a);
    npy_intp nb = PyArray_NBYTES(out);
    if (o + nb <= p || p + nb <= o) return 1;
    int nd = PyArray_NDIM(out);
    return o == p && memcmp(PyArray_STRIDES(out), PyArray_STRIDES(a), nd * sizeof(npy_intp)) == 0;
}

/* out= for like's dtype and shape, every check of check_out passed (1), or not vouched for (0). */
static int np_out_ok(PyArrayObject *out, PyArrayObject *like, PyArrayObject *other) {
    if (PyArray_DESCR(out) != PyArray_DESCR(like) || !same_shape(out, like) || !PyArray_ISWRITEABLE(out) ||
        !np_direct(out))
        return 0;
    if (PyArray_SIZE(out) == 0) return 1;
    return np_separate(out, like) && (other == NULL || np_separate(out, other));
}

static PyObject *np_empty_like(PyArrayObject *a) {
    PyArray_Descr *d = PyArray_DESCR(a);
    Py_INCREF(d);
    return PyArray_NewFromDescr(&PyArray_Type, d, PyArray_NDIM(a), PyArray_DIMS(a), NULL, NULL, 0, NULL);
}

static PyObject *np_call(OpObject *op, PyObject *dir, PyArrayObject *u, PyArrayObject *a, PyObject *out,
                         PyObject *backend, PyObject *const *params) {
    int arity = u ? 2 : 1;
    if (!np_direct(a) || (u && !np_direct(u))) Py_RETURN_NONE;
    if (out != Py_None && !np_out_ok((PyArrayObject *)out, a, u)) Py_RETURN_NONE;
    NativeObject *nat = lookup(op, dir, (PyObject *)PyArray_DESCR(a), params, backend, arity, NULL);
    if (!nat) Py_RETURN_NONE;
    PyObject *res;
    if (out == Py_None) {
        res = np_empty_like(a);
        if (!res) {
            Py_DECREF(nat);
            return NULL;
        }
    } else {
        Py_INCREF(out);
        res = out;
    }
    size_t n = (size_t)PyArray_SIZE(a);
    if (n && run(nat, (uintptr_t)PyArray_DATA(u ? u : a), (uintptr_t)PyArray_DATA(a),
                 (uintptr_t)PyArray_DATA((PyArrayObject *)res), n) < 0) {
        Py_DECREF(nat);
        Py_DECREF(res);
        return NULL;
    }
    Py_DECREF(nat);
    return res;
}

/* ---- torch tensors ---- */

/* What the hot path reads of a tensor.  Through the AOTInductor C shim of libtorch where set_shim() gave
   its getters (a stable C ABI: each takes an AtenTensorHandle, a pointer to an at::Tensor, which is one
   TensorImpl pointer, the tensor's `_cdata`), verified by hot.py on probe tensors against what Python
   reads; else through the tensor's Python attributes and methods. */
/* A bool attribute or method result of a tensor: 1, 0, or -1 (not vouched for; no error set). */
static int t_flag(PyObject *t, PyObject *name, int method) {
    PyObject *r = method ? PyObject_VectorcallMethod(name, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL)
                         : PyObject_GetAttr(t, name);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    int v = r == Py_True ? 1 : r == Py_False ? 0 : -1;
    Py_DECREF(r);
    return v;
}

static int t_int(PyObject *t, PyObject *name, unsigned long long *v) {
    PyObject *r = PyObject_VectorcallMethod(name, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (!r) {
        PyErr_Clear();
        return 0;
    }
    *v = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (*v == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

typedef int32_t (*shim_ptr_fn)(void *, void **);
typedef int32_t (*shim_i64_fn)(void *, int64_t *);
typedef int32_t (*shim_i32_fn)(void *, int32_t *);
typedef int32_t (*shim_bool_fn)(void *, unsigned char *);
typedef int32_t (*shim_sizes_fn)(void *, int64_t **);
typedef int32_t (*shim_empty_fn)(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t, void **);
typedef int32_t (*shim_delete_fn)(void *);
typedef PyObject *(*wrap_fn)(const void *); /* torch's THPVariable_Wrap(const at::TensorBase &) */

#define MAX_DTYPES 8
static struct {
    int on;
    shim_ptr_fn data_ptr;
    shim_i64_fn numel, dim;
    shim_i32_fn dtype, device_type, layout;
    shim_bool_fn contiguous;
    shim_sizes_fn sizes, strides;
    shim_i32_fn device_index;
    shim_empty_fn empty_strided;
    shim_delete_fn delete_tensor;
    wrap_fn wrap; /* NULL: results come from torch.empty_like */
    int32_t cpu, strided;
    Py_ssize_t inline_offset; /* where the at::Tensor is in a tensor's Python object; 0: read `_cdata` */
    int ndtypes;
    int32_t codes[MAX_DTYPES];
    PyObject *dtypes[MAX_DTYPES];
} shim;

typedef struct {
    PyObject *dtype;  /* a new reference, or NULL: not a dtype of the table (shim) */
    int32_t code;     /* shim: the dtype's code */
    int cpu, strided; /* 1 or 0 */
    void *h;          /* shim: the AtenTensorHandle (an at::Tensor *) */
    void *impl;       /* shim, where the handle is not read in place: the TensorImpl, which h points to */
} tinfo;

/* The shim's handle of a tensor: its at::Tensor, in place in the Python object where set_shim() was told
   (and hot.py checked) that it is there, else a copy of its one pointer, the TensorImpl (`_cdata`). */
static void *t_handle(PyObject *t, tinfo *f) {
    if (shim.inline_offset) return (char *)t + shim.inline_offset;
    PyObject *c = PyObject_GetAttr(t, s_cdata);
    if (!c) {
        PyErr_Clear();
        return NULL;
    }
    f->impl = PyLong_AsVoidPtr(c);
    Py_DECREF(c);
    if (!f->impl) {
        PyErr_Clear();
        return NULL;
    }
    return &f->impl;
}

/* dtype, device and layout of t; 0 where they cannot be read (not vouched for). */
static int t_info(PyObject *t, tinfo *f) {
    f->dtype = NULL;
    if (shim.on) {
        int32_t dt, dev, lay;
        if (!(f->h = t_handle(t, f))) return 0;
        if (shim.dtype(f->h, &dt) || shim.device_type(f->h, &dev) || shim.layout(f->h, &lay)) return 0;
        f->code = dt;
        for (int i = 0; i < shim.ndtypes; i++)
            if (shim.codes[i] == dt) {
                Py_INCREF(shim.dtypes[i]);
                f->dtype = shim.dtypes[i];
            }
        f->cpu = dev == shim.cpu;
        f->strided = lay == shim.strided;
        return 1;
    }
    f->h = NULL;
    if (!(f->dtype = PyObject_GetAttr(t, s_dtype))) {
        PyErr_Clear();
        return 0;
    }
    f->cpu = t_flag(t, s_is_cpu, 0) == 1;
    PyObject *layout = PyObject_GetAttr(t, s_layout);
    if (!layout) {
        PyErr_Clear();
        return 0;
    }
    f->strided = layout == t_strided;
    Py_DECREF(layout);
    return 1;
}

/* hot.direct_test of a CPU tensor read by t_info: strided, contiguous, no negative bit. */
static int t_direct(PyObject *t, tinfo *f) {
    if (!f->cpu || !f->strided) return 0;
    if (shim.on) {
        unsigned char c = 0;
        if (shim.contiguous(f->h, &c) || !c) return 0;
    } else if (t_flag(t, s_is_contiguous, 1) != 1) {
        return 0;
    }
    PyObject *neg = PyObject_Vectorcall(t_is_neg, &t, 1, NULL); /* TensorBase.is_neg: no method lookup */
    if (!neg) PyErr_Clear();
    Py_XDECREF(neg);
    return neg == Py_False;
}

/* The data address of a direct tensor (0: not read). */
static uintptr_t t_address(PyObject *t, tinfo *f) {
    if (shim.on) {
        void *p = NULL;
        if (!f->h || shim.data_ptr(f->h, &p)) return 0;
        return (uintptr_t)p;
    }
    unsigned long long v;
    return t_int(t, s_data_ptr, &v) ? (uintptr_t)v : 0;
}

static int t_numel(PyObject *t, tinfo *f, unsigned long long *n) {
    if (shim.on) {
        int64_t v;
        if (shim.numel(f->h, &v) || v < 0) return 0;
        *n = (unsigned long long)v;
        return 1;
    }
    return t_int(t, s_numel, n);
}

/* A new tensor like the direct tensor a, as torch.empty_like(a) makes it (a's sizes and strides, which are dense,
   its dtype and device), and its data address: through the shim (aoti_torch_empty_strided, then torch's
   THPVariable_Wrap, which takes its own reference) where set_shim() gave both and hot.py checked them, else
   torch.empty_like itself.  NULL with an error set where the allocation fails. */
static PyObject *t_empty(PyObject *a, tinfo *fa, uintptr_t *addr) {
    PyObject *y;
    if (shim.wrap) {
        int64_t d, *sz, *st;
        int32_t di;
        void *h = NULL, *p = NULL;
        if (!shim.dim(fa->h, &d) && !shim.sizes(fa->h, &sz) && !shim.strides(fa->h, &st) &&
            !shim.device_index(fa->h, &di) && !shim.empty_strided(d, sz, st, fa->code, shim.cpu, di, &h)) {
            if (shim.data_ptr(h, &p)) {
                shim.delete_tensor(h);
            } else {
                y = shim.wrap(h);
                shim.delete_tensor(h);
                *addr = (uintptr_t)p;
                return y;
            }
        }
        /* anything the shim refused (no memory, say): torch.empty_like says why */
    }
    y = PyObject_Vectorcall(t_empty_like, &a, 1, NULL);
    if (!y) return NULL;
    tinfo fy = {NULL, 0, 0, 0, NULL, NULL};
    fy.h = shim.on ? t_handle(y, &fy) : NULL;
    *addr = t_address(y, &fy);
    return y;
}

static int t_same_shape(PyObject *u, tinfo *fu, PyObject *a, tinfo *fa) {
    if (shim.on) {
        int64_t du, da, *su, *sa;
        if (shim.dim(fu->h, &du) || shim.dim(fa->h, &da) || du != da) return 0;
        if (shim.sizes(fu->h, &su) || shim.sizes(fa->h, &sa)) return 0;
        return memcmp(su, sa, (size_t)du * sizeof(int64_t)) == 0;
    }
    PyObject *su = PyObject_GetAttr(u, s_shape), *sa = su ? PyObject_GetAttr(a, s_shape) : NULL;
    int eq = sa ? PyObject_RichCompareBool(su, sa, Py_EQ) : -1;
    Py_XDECREF(su);
    Py_XDECREF(sa);
    if (eq < 0) PyErr_Clear();
    return eq == 1;
}

/* Run nat on direct tensors a (and u, for a binary kernel: a's dtype and shape), into a new tensor like a;
   None where they are not direct, NULL with an error set where the allocation fails.  fa (and fu) were read
   by t_info, and a's dtype was the kernel's. */
static PyObject *t_exec(NativeObject *nat, PyObject *u, tinfo *fu, PyObject *a, tinfo *fa) {
    if (!t_direct(a, fa) || (u && (!t_direct(u, fu) || !t_same_shape(u, fu, a, fa)))) Py_RETURN_NONE;
    uintptr_t pa = t_address(a, fa), pu = u ? t_address(u, fu) : 0, py = 0;
    unsigned long long n;
    if (!t_numel(a, fa, &n) || (n && (!pa || (u && !pu)))) Py_RETURN_NONE;
    PyObject *y = t_empty(a, fa, &py);
    if (!y) return NULL;
    if (n) {
        if (!py) {
            Py_DECREF(y);
            Py_RETURN_NONE;
        }
        if (run(nat, u ? pu : pa, pa, py, (size_t)n) < 0) {
            Py_DECREF(y);
            return NULL;
        }
    }
    return y;
}

static PyObject *t_call(OpObject *op, PyObject *dir, PyObject *u, PyObject *a, PyObject *backend,
                        PyObject *const *params, int mt) {
    tinfo fa, fu = {NULL, 0, 0, 0, NULL, NULL};
    NativeObject *nat = NULL;
    PyObject *y = Py_None;
    int ok = t_info(a, &fa) && fa.dtype && fa.cpu;
    if (ok && u) ok = t_info(u, &fu) && fu.dtype == fa.dtype && fu.cpu; /* torch dtypes are singletons */
    PyObject *hit = NULL;
    if (ok) nat = lookup(op, dir, fa.dtype, params, backend, u ? 2 : 1, &hit);
    Py_XDECREF(fa.dtype);
    Py_XDECREF(fu.dtype);
    if (!nat) Py_RETURN_NONE;
    if (mt) { /* autograd must record it: multiact.torch's autograd path, for which the Hit is returned */
        int rg = t_flag(a, s_requires_grad, 0);
        if (rg) {
            PyObject *on = rg < 0 ? NULL : PyObject_CallNoArgs(t_grad_on);
            if (on == Py_True && fa.cpu) {
                y = hit; /* a CPU tensor and a cached call: _Eager, as the Python path decides */
            } else if (on != Py_False) {
                ok = 0;
            }
            Py_XDECREF(on);
            PyErr_Clear();
        }
    }
    if (ok && y == Py_None) {
        y = t_exec(nat, u, &fu, a, &fa);
    } else {
        Py_INCREF(ok ? y : Py_None);
        y = ok ? y : Py_None;
    }
    Py_DECREF(nat);
    return y;
}

/* run(native, x) or run(native, u, x): the cached kernel on plain CPU tensors (multiact.torch's autograd path,
   which has the hit in hand): a new tensor like x, or None where the tensors are not direct, or of another
   dtype than the kernel's. */
static PyObject *run_tensors(PyObject *Py_UNUSED(mod), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3 || Py_TYPE(args[0]) != &NativeType) {
        PyErr_SetString(PyExc_TypeError, "run(native, x) or run(native, u, x)");
        return NULL;
    }
    NativeObject *nat = (NativeObject *)args[0];
    PyObject *a = args[nargs - 1], *u = nargs == 3 ? args[1] : NULL;
    tinfo fa, fu = {NULL, 0, 0, 0, NULL, NULL};
    if (!tensor_type || nat->arity != nargs - 1 || Py_TYPE(a) != tensor_type || (u && Py_TYPE(u) != tensor_type))
        Py_RETURN_NONE;
    int ok = t_info(a, &fa) && fa.dtype && fa.cpu;
    if (ok && u) ok = t_info(u, &fu) && fu.dtype == fa.dtype && fu.cpu;
    PyObject *dtype = fa.dtype;
    Py_XDECREF(fa.dtype);
    Py_XDECREF(fu.dtype);
    if (!ok || dtype != nat->dtype) Py_RETURN_NONE;
    return t_exec(nat, u, &fu, a, &fa);
}

/* Whether a torch builtin answers falsy (0), truthy (1), or fails (-1, no error set). */
static int t_falsy(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (!r) {
        PyErr_Clear();
        return -1;
    }
    int t = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (t < 0) PyErr_Clear();
    return t == 0;
}

static int backend_ok(PyObject *b) { return b == Py_None || PyUnicode_CheckExact(b); }

static int params_ok(OpObject *op, PyObject *const *params) {
    for (int i = 0; i < op->nparams; i++)
        if (!param_ok(op->kinds[i], params[i])) return 0;
    return 1;
}

static PyObject *Op_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    OpObject *op = (OpObject *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    int fixed = op->form == FORM_GRAD ? 5 : 3;
    if (!scope_var) Py_RETURN_NONE; /* setup() not called: the Python paths */
    if (kwnames || nargs != fixed + op->nparams) {
        PyErr_Format(PyExc_TypeError, "multiact._hotpath.Op: %zd positional arguments, expected %d", nargs,
                     fixed + op->nparams);
        return NULL;
    }
    PyObject *const *params = args + fixed;
    if (op->form == FORM_FWD) { /* (x, out, backend, *params) */
        PyObject *x = args[0], *out = args[1], *backend = args[2];
        if (!backend_ok(backend) || !params_ok(op, params)) Py_RETURN_NONE;
        if (PyArray_CheckExact(x)) {
            if (out != Py_None && !PyArray_CheckExact(out)) Py_RETURN_NONE;
            return np_call(op, op->dir, NULL, (PyArrayObject *)x, out, backend, params);
        }
        if (tensor_type && Py_TYPE(x) == tensor_type && out == Py_None)
            return t_call(op, op->dir, NULL, x, backend, params, 0);
        Py_RETURN_NONE;
    }
    if (op->form == FORM_GRAD) { /* (dy, x, y, out, backend, *params) */
        PyObject *dy = args[0], *x = args[1], *y = args[2], *out = args[3], *backend = args[4], *a, *dir;
        if (y == Py_None) {
            a = x;
            dir = op->dir;
        } else if (x == Py_None) {
            a = y;
            dir = op->dir_y;
        } else {
            Py_RETURN_NONE;
        }
        if (!backend_ok(backend) || !params_ok(op, params)) Py_RETURN_NONE;
        if (PyArray_CheckExact(dy) && PyArray_CheckExact(a)) {
            if (out != Py_None && !PyArray_CheckExact(out)) Py_RETURN_NONE;
            if (PyArray_DESCR((PyArrayObject *)dy) != PyArray_DESCR((PyArrayObject *)a) ||
                !same_shape((PyArrayObject *)dy, (PyArrayObject *)a))
                Py_RETURN_NONE;
            return np_call(op, dir, (PyArrayObject *)dy, (PyArrayObject *)a, out, backend, params);
        }
        if (tensor_type && Py_TYPE(dy) == tensor_type && Py_TYPE(a) == tensor_type && out == Py_None)
            return t_call(op, dir, dy, a, backend, params, 0);
        Py_RETURN_NONE;
    }
    /* FORM_MT: (x, inplace, backend, *params) */
    PyObject *x = args[0], *inplace = args[1], *backend = args[2];
    if (!tensor_type || Py_TYPE(x) != tensor_type || inplace != Py_False || !backend_ok(backend) ||
        !params_ok(op, params))
        Py_RETURN_NONE;
    /* torch.compiler.is_compiling() outside TorchScript (the caller asked torch.compiler.is_dynamo_compiling()) */
    PyObject *compiling = PyDict_GetItemWithError(t_compiler, s_compiling_flag);
    if (compiling != Py_False) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (t_falsy(t_tracing) != 1 || t_falsy(t_transforms) != 1 || t_falsy(t_fmode) != 1 || t_falsy(t_dstack) != 1)
        Py_RETURN_NONE;
    return t_call(op, op->dir, NULL, x, backend, params, 1);
}

static PyObject *Op_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *cache;
    const char *form, *kinds;
    static char *names[] = {"cache", "form", "kinds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!ss", names, &PyDict_Type, &cache, &form, &kinds)) return NULL;
    int f = strcmp(form, "forward") == 0 ? FORM_FWD : strcmp(form, "grad") == 0 ? FORM_GRAD
          : strcmp(form, "torch") == 0 ? FORM_MT : -1;
    size_t np_ = strlen(kinds);
    if (f < 0 || np_ > MAX_PARAMS || strspn(kinds, "nc") != np_) {
        PyErr_SetString(PyExc_ValueError, "Op(cache, form, kinds): form is forward, grad or torch; kinds a str of "
                                          "'n' (number) and 'c' (choice), at most 8");
        return NULL;
    }
    OpObject *self = (OpObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = Op_vectorcall;
    Py_INCREF(cache);
    self->cache = cache;
    self->dir = PyUnicode_InternFromString(f == FORM_GRAD ? "backward" : "forward");
    self->dir_y = PyUnicode_InternFromString("backward_y");
    self->form = f;
    self->nparams = (int)np_;
    memcpy(self->kinds, kinds, np_);
    if (!self->dir || !self->dir_y) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void Op_dealloc(OpObject *self) {
    for (int k = 0; k < MEMO; k++) memo_clear(self, &self->memo[k]);
    Py_XDECREF(self->cache);
    Py_XDECREF(self->dir);
    Py_XDECREF(self->dir_y);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject OpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "multiact._hotpath.Op",
    .tp_basicsize = sizeof(OpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Op(cache, form, kinds): the C hot path of one generated function (see the module's doc).",
    .tp_new = Op_new,
    .tp_dealloc = (destructor)Op_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(OpObject, vectorcall),
};

/* ---- module ------------------------------------------------------------------------------------- */

static PyObject *setup(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *var, *config;
    if (!PyArg_ParseTuple(args, "O!O", &PyContextVar_Type, &var, &config)) return NULL;
    PyObject *d = PyObject_GetAttrString(config, "__dict__");
    if (!d) return NULL;
    PyObject *g = PyObject_GetAttrString(config, "get_num_threads");
    if (!g) {
        Py_DECREF(d);
        return NULL;
    }
    Py_INCREF(var);
    Py_XSETREF(scope_var, var);
    Py_XSETREF(config_dict, d);
    Py_XSETREF(get_threads, g);
    Py_RETURN_NONE;
}

static PyObject *set_torch(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *tensor, *compiler, *fns[8];
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOO", &PyType_Type, &tensor, &compiler, &fns[0], &fns[1], &fns[2], &fns[3],
                          &fns[4], &fns[5], &fns[6], &fns[7]))
        return NULL;
    PyObject *cdict = PyObject_GetAttrString(compiler, "__dict__");
    if (!cdict) return NULL;
    if (!PyDict_Check(cdict)) {
        Py_DECREF(cdict);
        PyErr_SetString(PyExc_TypeError, "set_torch: torch.compiler has no __dict__");
        return NULL;
    }
    PyObject **slots[8] = {&t_empty_like, &t_strided, &t_is_neg, &t_grad_on, &t_tracing, &t_transforms, &t_fmode,
                           &t_dstack};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(fns[i]);
        Py_XSETREF(*slots[i], fns[i]);
    }
    Py_XSETREF(t_compiler, cdict);
    Py_INCREF(tensor);
    Py_XSETREF(tensor_type, (PyTypeObject *)tensor);
    Py_RETURN_NONE;
}

#define SHIM_FNS 12
static PyObject *set_shim(PyObject *Py_UNUSED(mod), PyObject *args) {
    PyObject *fns, *dtypes, *wrap;
    int cpu, strided, inplace;
    if (!PyArg_ParseTuple(args, "|OO!iipO", &fns, &PyDict_Type, &dtypes, &cpu, &strided, &inplace, &wrap))
        return NULL;
    for (int i = 0; i < shim.ndtypes; i++) Py_CLEAR(shim.dtypes[i]);
    shim.on = shim.ndtypes = 0;
    shim.inline_offset = 0;
    shim.wrap = NULL;
    if (PyTuple_GET_SIZE(args) == 0) Py_RETURN_NONE; /* set_shim(): off */
    if (PyTuple_GET_SIZE(args) != 6) {
        PyErr_SetString(PyExc_TypeError, "set_shim(addresses, dtypes, cpu, strided, in_place, wrap), or set_shim()");
        return NULL;
    }
    void *f[SHIM_FNS], *w = NULL;
    if (!PyTuple_Check(fns) || PyTuple_GET_SIZE(fns) != SHIM_FNS) {
        PyErr_SetString(PyExc_TypeError, "set_shim: 12 addresses (hot._SHIM_FUNCTIONS)");
        return NULL;
    }
    for (int i = 0; i < SHIM_FNS; i++) {
        f[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
        if (!f[i]) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "set_shim: a null address");
            return NULL;
        }
    }
    if (wrap != Py_None && !(w = PyLong_AsVoidPtr(wrap))) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "set_shim: a null address");
        return NULL;
    }
    if (PyDict_GET_SIZE(dtypes) > MAX_DTYPES) {
        PyErr_SetString(PyExc_ValueError, "set_shim: too many dtypes");
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (PyDict_Next(dtypes, &pos, &k, &v)) {
        long code = PyLong_AsLong(k);
        if (code == -1 && PyErr_Occurred()) return NULL;
        shim.codes[shim.ndtypes] = (int32_t)code;
        Py_INCREF(v);
        shim.dtypes[shim.ndtypes++] = v;
    }
    shim.data_ptr = (shim_ptr_fn)f[0];
    shim.numel = (shim_i64_fn)f[1];
    shim.dim = (shim_i64_fn)f[2];
    shim.dtype = (shim_i32_fn)f[3];
    shim.device_type = (shim_i32_fn)f[4];
    shim.layout = (shim_i32_fn)f[5];
    shim.contiguous = (shim_bool_fn)f[6];
    shim.sizes = (shim_sizes_fn)f[7];
    shim.strides = (shim_sizes_fn)f[8];
    shim.device_index = (shim_i32_fn)f[9];
    shim.empty_strided = (shim_empty_fn)f[10];
    shim.delete_tensor = (shim_delete_fn)f[11];
    shim.wrap = (wrap_fn)w;
    shim.cpu = cpu;
    shim.strided = strided;
    shim.inline_offset = inplace ? (Py_ssize_t)sizeof(PyObject) : 0;
    shim.on = 1;
    Py_RETURN_NONE;
}

/* The new tensor and its address the hot path would return for the direct tensor t (for hot.py's check of
   the shim's allocation against torch.empty_like), or None. */
static PyObject *probe_empty(PyObject *Py_UNUSED(mod), PyObject *t) {
    tinfo f;
    uintptr_t addr = 0;
    if (!tensor_type || Py_TYPE(t) != tensor_type || !t_info(t, &f)) Py_RETURN_NONE;
    Py_XDECREF(f.dtype);
    if (!f.dtype || !t_direct(t, &f)) Py_RETURN_NONE;
    PyObject *y = t_empty(t, &f, &addr);
    if (!y) return NULL;
    return Py_BuildValue("(NN)", y, PyLong_FromVoidPtr((void *)addr));
}

/* The TensorImpl address the shim's handle of t holds (hot.py compares it with t._cdata), or None. */
static PyObject *tensor_impl(PyObject *Py_UNUSED(mod), PyObject *t) {
    tinfo f;
    void *h;
    if (!shim.on || !tensor_type || Py_TYPE(t) != tensor_type || !(h = t_handle(t, &f))) Py_RETURN_NONE;
    return PyLong_FromVoidPtr(*(void **)h);
}

/* What the hot path reads of a tensor, as Python values, for hot.py to check against torch's own answers:
   (dtype or None, is_cpu, strided, direct, data address or None, numel or None, shape or None). */
static PyObject *probe(PyObject *Py_UNUSED(mod), PyObject *t) {
    tinfo f;
    if (!tensor_type || Py_TYPE(t) != tensor_type || !t_info(t, &f)) Py_RETURN_NONE;
    int direct = t_direct(t, &f);
    PyObject *addr = Py_None, *numel = Py_None, *shape = Py_None, *r;
    unsigned long long n;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (direct) {
        uintptr_t p = t_address(t, &f);
        Py_SETREF(addr, PyLong_FromVoidPtr((void *)p));
        if (t_numel(t, &f, &n)) Py_SETREF(numel, PyLong_FromUnsignedLongLong(n));
        if (shim.on) {
            int64_t d, *sz;
            if (!shim.dim(f.h, &d) && !shim.sizes(f.h, &sz)) {
                Py_SETREF(shape, PyTuple_New(d));
                for (int64_t i = 0; shape && i < d; i++) PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(sz[i]));
            }
        }
    }
    r = Py_BuildValue("(OiiiNNN)", f.dtype ? f.dtype : Py_None, f.cpu, f.strided, direct, addr, numel, shape);
    Py_XDECREF(f.dtype);
    return r;
}

static PyObject *invalidate(PyObject *Py_UNUSED(mod), PyObject *Py_UNUSED(args)) {
    generation++;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"run", (PyCFunction)(void (*)(void))run_tensors, METH_FASTCALL,
     "run(native, x) or run(native, u, x): the kernel on plain CPU tensors (see run_tensors)."},
    {"invalidate", invalidate, METH_NOARGS, "invalidate(): the hot-path caches were cleared (hot.clear)."},
    {"setup", setup, METH_VARARGS, "setup(scope_var, config_module): the ma.use ContextVar and the thread setting."},
    {"set_torch", set_torch, METH_VARARGS,
     "set_torch(Tensor, torch.compiler, empty_like, strided, TensorBase.is_neg, is_grad_enabled, is_tracing, are_functorch_transforms_active, "
     "is_torch_function_mode_enabled, len_torch_dispatch_stack): what the tensor forms need."},
    {"set_shim", set_shim, METH_VARARGS,
     "set_shim(addresses, {code: dtype}, cpu, strided, in_place, wrap): read and make tensors through libtorch's AOTInductor C shim "
     "(hot.py verifies it with probe()); set_shim(): through their Python attributes."},
    {"tensor_impl", tensor_impl, METH_O, "tensor_impl(tensor): the TensorImpl its shim handle holds (for hot.py)."},
    {"probe_empty", probe_empty, METH_O, "probe_empty(tensor): (the hot path's new tensor like it, its address)."},
    {"probe", probe, METH_O, "probe(tensor): what the hot path reads of a tensor (for hot.py's check)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "multiact._hotpath",
    .m_doc = "The hot path of the generated op functions, in C (native/hotpath/hotpath.c).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    import_array();
    if (PyType_Ready(&NativeType) < 0 || PyType_Ready(&OpType) < 0) return NULL;
    struct { PyObject **s; const char *text; } strs[] = {
        {&s_c, "c"}, {&s_dtype, "dtype"}, {&s_is_cpu, "is_cpu"}, {&s_layout, "layout"},
        {&s_is_contiguous, "is_contiguous"}, {&s_is_neg, "is_neg"}, {&s_data_ptr, "data_ptr"}, {&s_numel, "numel"},
        {&s_requires_grad, "requires_grad"}, {&s_shape, "shape"}, {&s_threads, "_threads"}, {&s_cdata, "_cdata"},
        {&s_compiling_flag, "_is_compiling_flag"},
    };
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!(*strs[i].s = PyUnicode_InternFromString(strs[i].text))) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Native", (PyObject *)&NativeType) < 0 ||
        PyModule_AddObjectRef(m, "Op", (PyObject *)&OpType) < 0 ||
        PyModule_AddIntConstant(m, "RELEASE_WORK", RELEASE_WORK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
