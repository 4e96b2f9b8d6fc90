/*
 * libhwfs_gpu.c — the GPU plane of the client library (docs/gpu.md): ask the
 * daemon to shadow-load a version into device memory (hwfs_load), to drop it
 * (hwfs_unload), and map a loaded version's device buckets into this process
 * with CUDA IPC (hwfs_map_gpu).
 *
 * The daemon answers {"op": "gpumap"} with one cudaIpcMemHandle per bucket
 * (128 hex digits) and every tensor's place in them; the answer is checked as
 * if hostile before any of it is used: a handle is exactly 128 lowercase hex
 * digits, a tensor's bucket exists and [offset, offset+len) lies inside it
 * without overflow, names are valid (as libhwfs_map.c checks them).  Then the
 * CUDA runtime (gpu/cudart.h: dlopen, no CUDA header) opens each bucket with
 * cudaIpcOpenMemHandle(LazyEnablePeerAccess) on the device, and every
 * tensor's data is a device pointer into its bucket.  The connection stays
 * open as the map's reference on the daemon's device copy (the daemon frees
 * an unloaded copy only when no gpumap connection remains); the real unmap
 * (lib_map_put, at the last reference) closes the buckets, then the
 * connection.
 *
 * Device numbers: the daemon's GPU N may be another number here (Ray and
 * vLLM set CUDA_VISIBLE_DEVICES per worker), so the answer carries the
 * device's PCI bus id and the map is made on the device that id names in
 * this process (cudaDeviceGetByPCIBusId); hwfs_map_device() says which.
 *
 * The CUDA current device is a per-thread setting of the caller's.  When the
 * calling thread has a context current (cuCtxGetCurrent of the driver, asked
 * without making one), its device is read (cudaGetDevice) and put back after
 * the IPC calls.  When it has none, nothing is put back: cudaGetDevice says 0
 * on a thread that never used CUDA, and setting device 0 would make a context
 * on a GPU this process may never use.
 *
 * The real unmap synchronises the device before it closes the buckets: a
 * consumer (torch) may drop its last tensor while a kernel still reads it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "libhwfs_i.h"
#include "cudart.h"

/* A gpumap answer larger than this many buckets is refused (a lie, not a version). */
#define MAX_BUCKETS (1u << 20)

/*
 * Send {"op": @op, "version": @version, "gpu": @gpu} on a connection of its
 * own, progress lines to @progress (may be NULL), and check the answer: the
 * request of hwfs_load() and hwfs_unload().  Returns 0 or -errno (sentence set).
 */
static int gpu_request(struct hwfs *h, const char *op, const char *version, int gpu,
		       hwfs_progress_fn progress, void *arg)
{
	json_t *req, *res = NULL;
	int r;

	req = json_pack("{s:s, s:s, s:i}", "op", op, "version", version, "gpu", gpu);
	if (!req)
		return lib_fail(-ENOMEM, "out of memory");
	r = lib_call(h, req, progress, arg, &res);
	if (r == 0)
		r = lib_check(res);
	json_decref(req);
	json_decref(res);
	return r;
}

int hwfs_load(struct hwfs *h, const char *version, int gpu, hwfs_progress_fn progress,
	      void *arg)
{
	lib_clear_error();
	if (!lib_valid_name(version))
		return lib_fail(-EINVAL, "invalid version name");
	if (gpu < 0)
		return lib_fail(-EINVAL, "invalid GPU %d (a device index: 0, 1, ...)", gpu);
	return gpu_request(h, "load", version, gpu, progress, arg);
}

int hwfs_unload(struct hwfs *h, const char *version, int gpu)
{
	lib_clear_error();
	if (!lib_valid_name(version))
		return lib_fail(-EINVAL, "invalid version name");
	if (gpu < -1)
		return lib_fail(-EINVAL, "invalid GPU %d (a device index, or -1 for every one)",
				gpu);
	return gpu_request(h, "unload", version, gpu, NULL, NULL);
}

/* ------------------------------------------------------------ the device */

typedef cudart_err (*get_device_fn)(int *dev);
typedef int (*ctx_get_current_fn)(void **ctx); /* cuCtxGetCurrent: CUresult, CUcontext * */

/*
 * Whether the calling thread has a CUDA context current, asked without making
 * one: cuCtxGetCurrent of the driver (libcuda.so.1, loaded by the runtime once
 * it ran; RTLD_NOLOAD: never loaded here).  1 yes, 0 no, -1 cannot tell.
 * cudaGetDevice cannot say: it answers 0 on a thread that never used CUDA,
 * and cudaSetDevice(0) then would make device 0's primary context.
 */
static int context_current(const struct cudart *rt)
{
	ctx_get_current_fn get = (ctx_get_current_fn)dlsym(rt->dl, "cuCtxGetCurrent");
	void *ctx = NULL;

	if (!get) {
		void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

		if (!cu)
			return -1;
		get = (ctx_get_current_fn)dlsym(cu, "cuCtxGetCurrent");
		dlclose(cu); /* drops the reference NOLOAD took; the runtime's stays */
		if (!get)
			return -1;
	}
	if (get(&ctx) != 0)
		return -1;
	return ctx != NULL;
}

/*
 * Make @dev the calling thread's current device, remembering in *@was the one
 * to put back: the device of the context that was current, or -1 when no
 * context was current (or that cannot be told), in which case nothing is put
 * back: setting a device the thread never used would make its context.
 * Returns the runtime's error.
 */
static cudart_err enter_device(const struct cudart *rt, int dev, int *was)
{
	get_device_fn get = (get_device_fn)dlsym(rt->dl, "cudaGetDevice");

	*was = -1;
	if (get && context_current(rt) == 1 && get(was) != CUDART_SUCCESS)
		*was = -1;
	return rt->SetDevice(dev);
}

/* Put back the device enter_device() found (nothing when it found none or the same). */
static void leave_device(const struct cudart *rt, int dev, int was)
{
	if (was >= 0 && was != dev)
		rt->SetDevice(was);
}

void lib_gpu_release(struct hwfs_map *m)
{
	cudart_err e;
	int was;

	if (!m->rt)
		return;
	if (m->buckets) {
		e = enter_device(m->rt, m->device, &was);
		/*
		 * A consumer may free its last tensor while a kernel still reads it
		 * (torch drops storage without a stream sync): wait for the device's
		 * work before the mappings go.
		 */
		if (e == CUDART_SUCCESS)
			m->rt->DeviceSynchronize(); /* a failure here is the kernel's: close anyway */
		for (size_t i = 0; i < m->n_buckets; i++)
			if (m->buckets[i])
				m->rt->IpcCloseMemHandle(m->buckets[i]);
		leave_device(m->rt, m->device, was);
	}
	free(m->buckets);
	m->buckets = NULL;
	cudart_close(m->rt);
	m->rt = NULL;
}

/* ------------------------------------------------------------ hwfs_map_gpu */

/* One bucket of the answer: its IPC handle and size. */
struct bucket {
	cudart_ipc_handle handle;
	uint64_t bytes;
};

/* Exactly 128 lowercase hex digits into @h (64 bytes). Returns 0 or -EINVAL. */
static int parse_handle(const char *hex, cudart_ipc_handle *h)
{
	static const char digits[] = "0123456789abcdef";

	if (!hex || strlen(hex) != 2 * CUDART_IPC_HANDLE_SIZE)
		return -EINVAL;
	for (size_t i = 0; i < CUDART_IPC_HANDLE_SIZE; i++) {
		const char *hi = hex[2 * i] ? strchr(digits, hex[2 * i]) : NULL;
		const char *lo = hex[2 * i + 1] ? strchr(digits, hex[2 * i + 1]) : NULL;

		if (!hi || !lo)
			return -EINVAL;
		h->reserved[i] = (char)(((hi - digits) << 4) | (lo - digits));
	}
	return 0;
}

/*
 * Read the "buckets" of answer @res into *@out (*@n entries, free with
 * free()).  Returns 0, -EPROTO (sentence set), -ENOMEM.
 */
static int read_buckets(json_t *res, struct bucket **out, size_t *n)
{
	json_t *arr = json_object_get(res, "buckets"), *b;
	struct bucket *x;
	size_t i;

	if (!json_is_array(arr) || json_array_size(arr) > MAX_BUCKETS)
		return lib_fail(-EPROTO, "malformed gpumap answer: no bucket list");
	x = calloc(json_array_size(arr) + 1, sizeof(*x));
	if (!x)
		return lib_fail(-ENOMEM, "out of memory");
	json_array_foreach(arr, i, b) {
		if (!json_is_object(b) || parse_handle(lib_jstr(b, "handle"), &x[i].handle) < 0 ||
		    lib_get_u64(b, "bytes", &x[i].bytes) < 0) {
			free(x);
			return lib_fail(-EPROTO, "malformed gpumap answer: bucket %zu has no valid "
					"handle (128 lowercase hex digits) or size", i);
		}
	}
	*out = x;
	*n = json_array_size(arr);
	return 0;
}

/*
 * Fill tensor @t from record @jt: names, dtype, shape (stored at *@shape_at,
 * which advances), hash, and its place, checked against @b (@nb buckets).
 * The data pointer is set later, once the buckets are open: its offset in
 * the bucket goes to *@off and the bucket to *@bucket.  Returns 0 or -EPROTO.
 */
static int read_tensor(json_t *jt, size_t i, const struct bucket *b, size_t nb,
		       struct hwfs_tensor *t, uint64_t **shape_at, uint64_t *bucket,
		       uint64_t *off)
{
	json_t *shape = json_object_get(jt, "shape");

	t->name = lib_jstr(jt, "name");
	t->file = lib_jstr(jt, "file");
	t->dtype = lib_jstr(jt, "dtype");
	if (!t->name || !*t->name || !t->dtype || !*t->dtype || !lib_valid_file_path(t->file) ||
	    !json_is_array(shape) || lib_parse_hash(lib_jstr(jt, "hash"), t->hash) < 0)
		return lib_fail(-EPROTO, "malformed gpumap answer: tensor %zu has no valid name, "
				"file, dtype, shape or hash", i);
	if (lib_get_u64(jt, "bucket", bucket) < 0 || lib_get_u64(jt, "offset", off) < 0 ||
	    lib_get_u64(jt, "len", &t->len) < 0 || *bucket >= nb || *off > b[*bucket].bytes ||
	    t->len > b[*bucket].bytes - *off)
		return lib_fail(-EPROTO, "malformed gpumap answer: tensor %s lies outside its "
				"bucket", t->name);
	return lib_read_shape(shape, t, shape_at, "gpumap");
}

/*
 * Open the CUDA runtime into m->rt (to map @gpu).  Returns 0, -ENODEV (no
 * runtime or no device here), -ENOMEM, with the sentence.
 */
static int open_runtime(struct hwfs_map *m, int gpu)
{
	char why[512];
	int r = cudart_open(&m->rt, why, sizeof(why));

	if (r == -ENOMEM)
		return lib_fail(r, "out of memory");
	if (r < 0)
		return lib_fail(-ENODEV, "cannot map on GPU %d: %s", gpu, why);
	return 0;
}

/* A PCI bus id as the runtime writes it ("0000:3b:00.0"): hex digits, ':' and '.'. */
static int valid_pci(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	if (n < 7 || n > 32)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!strchr("0123456789abcdefABCDEF:.", s[i]))
			return 0;
	return 1;
}

/*
 * The daemon's device @gpu as this process numbers it (CUDA_VISIBLE_DEVICES
 * may renumber, or hide, devices per process): the answer's "pci" resolved
 * with cudaDeviceGetByPCIBusId into m->device; without one in the answer, or
 * when this process does not see it, the daemon's number.  Returns 0, or
 * -ENODEV when that device does not exist here, -EPROTO for a malformed
 * "pci", with the sentence.
 */
static int local_device(struct hwfs_map *m, json_t *res, int gpu)
{
	json_t *jp = json_object_get(res, "pci");
	const char *pci = json_string_value(jp);
	int dev = -1;

	if (jp && !valid_pci(pci))
		return lib_fail(-EPROTO, "malformed gpumap answer: \"pci\" is not a PCI bus id");
	if (pci && m->rt->DeviceGetByPCIBusId(&dev, pci) == CUDART_SUCCESS && dev >= 0 &&
	    dev < m->rt->devices) {
		m->device = dev;
		return 0;
	}
	if (gpu >= m->rt->devices) {
		if (pci)
			return lib_fail(-ENODEV, "cannot map on GPU %d: the daemon's GPU %d (PCI %s) "
					"is not visible in this process, which sees %d CUDA device%s "
					"(CUDA_VISIBLE_DEVICES?)", gpu, gpu, pci, m->rt->devices,
					m->rt->devices == 1 ? "" : "s");
		return lib_fail(-ENODEV, "cannot map on GPU %d: this process sees %d CUDA "
				"device%s (CUDA_VISIBLE_DEVICES?)", gpu, m->rt->devices,
				m->rt->devices == 1 ? "" : "s");
	}
	m->device = gpu;
	return 0;
}

/*
 * Open every bucket @b (@nb) of @m with cudaIpcOpenMemHandle on its device
 * into m->buckets.  Returns 0, -ENODEV (the device cannot be used), -EIO (a
 * handle cannot be opened: its process is gone, or another device's), with
 * the sentence; what was opened is closed by the real unmap.
 */
static int open_buckets(struct hwfs_map *m, const struct bucket *b, size_t nb)
{
	char eb[256];
	cudart_err e;
	int was, r = 0;

	m->buckets = calloc(nb + 1, sizeof(*m->buckets));
	if (!m->buckets)
		return lib_fail(-ENOMEM, "out of memory");
	m->n_buckets = nb;
	e = enter_device(m->rt, m->device, &was);
	if (e != CUDART_SUCCESS) {
		r = lib_fail(-ENODEV, "cannot use GPU %d: %s", m->device,
			     cudart_strerror(m->rt, e, eb, sizeof(eb)));
		goto out;
	}
	for (size_t i = 0; i < nb; i++) {
		e = m->rt->IpcOpenMemHandle(&m->buckets[i], b[i].handle,
					    CUDART_IPC_LAZY_PEER_ACCESS);
		if (e != CUDART_SUCCESS) {
			m->buckets[i] = NULL;
			r = lib_fail(-EIO, "cannot open bucket %zu of %s on GPU %d: %s", i,
				     m->version, m->device,
				     cudart_strerror(m->rt, e, eb, sizeof(eb)));
			goto out;
		}
	}
out:
	leave_device(m->rt, m->device, was);
	return r;
}

/*
 * Build the tensors of gpumap answer @res into @m: every record read and
 * checked first, then the buckets opened, then the data pointers set.
 * Returns 0 or -errno (sentence set).
 */
static int build_device_map(struct hwfs_map *m, json_t *res)
{
	json_t *ts = json_object_get(res, "tensors"), *jt;
	struct bucket *b = NULL;
	uint64_t *shape_at, *where = NULL;
	size_t i, nb = 0, dims = 0;
	int r = read_buckets(res, &b, &nb);

	if (r < 0)
		return r;
	if (!json_is_array(ts)) {
		r = lib_fail(-EPROTO, "malformed gpumap answer: no tensor list");
		goto out;
	}
	json_array_foreach(ts, i, jt)
		dims += json_array_size(json_object_get(jt, "shape"));
	m->n = json_array_size(ts);
	m->t = calloc(m->n + 1, sizeof(*m->t));
	m->shapes = calloc(dims + 1, sizeof(*m->shapes));
	m->by_name = calloc(m->n + 1, sizeof(*m->by_name));
	where = calloc(2 * m->n + 1, sizeof(*where));
	if (!m->t || !m->shapes || !m->by_name || !where) {
		m->n = 0;
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	shape_at = m->shapes;
	json_array_foreach(ts, i, jt) {
		if (!json_is_object(jt)) {
			r = lib_fail(-EPROTO, "malformed gpumap answer: tensor %zu", i);
			goto out;
		}
		r = read_tensor(jt, i, b, nb, &m->t[i], &shape_at, &where[2 * i],
				&where[2 * i + 1]);
		if (r < 0)
			goto out;
	}
	r = open_buckets(m, b, nb);
	if (r < 0)
		goto out;
	for (i = 0; i < m->n; i++)
		m->t[i].data = (const char *)m->buckets[where[2 * i]] + where[2 * i + 1];
	lib_map_index(m);
out:
	free(where);
	free(b);
	return r;
}

int hwfs_map_gpu(struct hwfs *h, const char *version, int gpu, struct hwfs_map **out)
{
	struct hwfs_map *m = lib_map_new();
	struct ctl_reader rd;
	json_t *req = NULL, *jg;
	uint8_t digest[16];
	int r;

	lib_clear_error();
	ctl_reader_init(&rd, -1);
	if (!m) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	if (!lib_valid_name(version)) {
		r = lib_fail(-EINVAL, "invalid version name");
		goto out;
	}
	if (gpu < 0) {
		r = lib_fail(-EINVAL, "invalid GPU %d (a device index: 0, 1, ...)", gpu);
		goto out;
	}
	/* no runtime or device here: say so before the daemon is asked for a reference */
	r = open_runtime(m, gpu);
	if (r < 0)
		goto out;
	req = json_pack("{s:s, s:s, s:i}", "op", "gpumap", "version", version, "gpu", gpu);
	if (!req) {
		r = lib_fail(-ENOMEM, "out of memory");
		goto out;
	}
	r = lib_map_request(h, m, req, &rd);
	if (r < 0)
		goto out;
	jg = json_object_get(m->reply, "gpu");
	if (!lib_valid_name(m->version) || strcmp(m->version, version) ||
	    lib_parse_hash(m->digest, digest) < 0 || !json_is_integer(jg) ||
	    json_integer_value(jg) != gpu) {
		r = lib_fail(-EPROTO, "malformed gpumap answer: it is not of the version and GPU "
				      "asked for (%s on GPU %d)", version, gpu);
		goto out;
	}
	r = local_device(m, m->reply, gpu);
	if (r < 0)
		goto out;
	r = build_device_map(m, m->reply);
	if (r < 0)
		goto out;
	*out = m;
	m = NULL;
out:
	ctl_reader_free(&rd);
	json_decref(req);
	lib_map_put(m);
	return r;
}
