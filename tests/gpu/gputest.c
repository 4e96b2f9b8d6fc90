/*
 * gputest.c — hwfs-gputest, the checks of the GPU plane on a real device.
 *
 * tests/gpu/run.sh mounts a real hwfs with --pin, publishes versions made by
 * `hwfs-gputest mkst` and runs the subcommands below one by one; each prints
 * one "PASS: ..." or "FAIL: ..." line per check and exits 1 when any check
 * failed (2 for a usage error).  The program uses the public API alone
 * (include/hwfs.h, linked from libhwfs.a) plus the CUDA runtime through
 * gpu/cudart.h (dlopen, as the daemon does), so it runs on a bare machine
 * with nothing but our binaries and the libraries carried beside them.
 *
 *   probe                      a CUDA device is usable here (else one line:
 *                              "test-gpu needs a CUDA device: <why>", exit 1)
 *   mkst FILE SEED BYTES       write a safetensors file (tests/gpu/stgen.h)
 *   pid MNT                    print the daemon's pid (for the cleanup)
 *   pinned MNT                 (a) status: store.pinned "cuda", a gpu object
 *   memory MNT V GPU           (d) device memory: taken by a load, kept by an
 *                              unload while a gpumap is open, given back when
 *                              it closes, and at once by an unload without one
 *   compare MNT V GPU          (b) every tensor of the device map, copied back
 *                              (D2H), equals the host map's bytes and its hash
 *   ipc MNT V GPU N            (c) N other processes open the IPC handles at the
 *                              same time as this one and compare
 *   removed MNT V GPU          (e) `rm` of a loaded version: its device copy
 *                              and gpumap stay valid (it stays loaded)
 *   dlpack MNT V GPU           (f) hwfs_map_dlpack of device and host maps
 *   engine MNT NAME GPU        (g) register engine NAME with device GPU
 *                              (hwfs_watch_open_gpu), print "registered ..."
 *                              and every event until the daemon closes the
 *                              stream or the process is killed (run.sh kills
 *                              it by pid)
 *   resident MNT V GPU         (g) status gpu.loads has V on GPU "loaded" and
 *                              MNT/current points at versions/V
 *   source MNT V GPU WANT      (h) load V (unloading it first): the answer's
 *                              "source" is WANT ("pinned" or "pageable"); V
 *                              stays loaded
 *
 * Device memory is judged with cudaMemGetInfo (the whole device's free
 * bytes): run.sh loads another version first so that the daemon's CUDA
 * context and streams exist before the first measure, and nothing else may
 * use the device meanwhile.  GPU_TEST_SLACK_MIB (default 64) is how far
 * "back where it was" may be off.
 */
#define _GNU_SOURCE
#include <dlpack/dlpack.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "cudart.h"
#include "hwfs.h"
#include "stgen.h"

#define USAGE                                                                          \
	"usage: hwfs-gputest probe | mkst FILE SEED BYTES | pid MNT | pinned MNT |\n"  \
	"       memory MNT V GPU | compare MNT V GPU | ipc MNT V GPU N | removed MNT V GPU |\n" \
	"       dlpack MNT V GPU | engine MNT NAME GPU | resident MNT V GPU |\n"            \
	"       source MNT V GPU pinned|pageable"
#define MIB (1024.0 * 1024.0)
#define FREE_WAIT_MS 10000 /* how long a free of device memory may take to show */

extern char **environ;

static int failures;
static struct cudart *rt;

/* One check: a PASS or FAIL line. */
static void check(int ok, const char *fmt, ...)
{
	va_list ap;

	printf("%s: ", ok ? "PASS" : "FAIL");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	if (!ok)
		failures++;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	exit(1);
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* The CUDA runtime of this process, set to @gpu; dies when there is none. */
static void cuda_open(int gpu)
{
	char why[512], eb[256];
	cudart_err e;

	if (!rt && cudart_open(&rt, why, sizeof(why)) < 0)
		die("this process cannot use CUDA: %s", why);
	if ((e = rt->SetDevice(gpu)))
		die("cudaSetDevice(%d): %s", gpu, cudart_strerror(rt, e, eb, sizeof(eb)));
}

static uint64_t dev_free(void)
{
	size_t f = 0, t = 0;
	char eb[256];
	cudart_err e = rt->MemGetInfo(&f, &t);

	if (e)
		die("cudaMemGetInfo: %s", cudart_strerror(rt, e, eb, sizeof(eb)));
	return f;
}

static struct hwfs *open_mount(const char *mnt)
{
	struct hwfs *h;
	int r = hwfs_open(mnt, &h);

	if (r < 0)
		die("hwfs_open(%s): %s", mnt, hwfs_errmsg());
	return h;
}

/* A control request (printf-style JSON) and its parsed answer; NULL when the call failed. */
static json_t *call(struct hwfs *h, const char *fmt, ...)
{
	char req[1024], *reply = NULL;
	va_list ap;
	json_t *j;
	int r;

	va_start(ap, fmt);
	vsnprintf(req, sizeof(req), fmt, ap);
	va_end(ap);
	r = hwfs_call(h, req, NULL, NULL, &reply);
	if (r < 0) {
		printf("note: %s: %s\n", req, hwfs_errmsg());
		return NULL;
	}
	j = json_loads(reply, 0, NULL);
	if (!j)
		printf("note: %s: unparsable answer %s\n", req, reply);
	free(reply);
	return j;
}

static int jtrue(json_t *o, const char *key)
{
	return json_is_true(json_object_get(o, key));
}

static long long jint(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	return json_is_integer(v) ? json_integer_value(v) : -1;
}

static uint64_t map_bytes(const struct hwfs_map *m)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < hwfs_map_count(m); i++)
		sum += hwfs_map_tensor(m, i)->len;
	return sum;
}

/*
 * Compare device map @dm with host map @hm: the same tensors (name, file,
 * dtype, shape, length, hash) in the same order, device pointers 256-byte
 * aligned, and every tensor's bytes copied back from the device equal to the
 * host's and to its hash.  One PASS/FAIL line (@what names it); details of
 * the first few mismatches as notes.
 */
static void compare_maps(const struct hwfs_map *hm, const struct hwfs_map *dm, const char *what)
{
	size_t n = hwfs_map_count(hm), bad = 0, unaligned = 0;
	uint64_t bytes = 0;
	char eb[256];

	if (hwfs_map_count(dm) != n) {
		check(0, "%s: device map has %zu tensors, host map %zu", what, hwfs_map_count(dm), n);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		const struct hwfs_tensor *a = hwfs_map_tensor(hm, i), *b = hwfs_map_tensor(dm, i);
		const char *why = NULL;
		uint8_t *buf = NULL;
		cudart_err e;

		if (strcmp(a->name, b->name) || strcmp(a->file, b->file))
			why = "name or file differs";
		else if (strcmp(a->dtype, b->dtype) || a->ndim != b->ndim ||
			 memcmp(a->shape, b->shape, a->ndim * sizeof(*a->shape)))
			why = "dtype or shape differs";
		else if (a->len != b->len || memcmp(a->hash, b->hash, 16))
			why = "length or hash differs";
		else if (!b->data && b->len)
			why = "NULL device pointer";
		if (!why && (uintptr_t)b->data % 256)
			unaligned++;
		if (!why && b->len) {
			buf = malloc(b->len);
			if (!buf)
				die("out of memory (%" PRIu64 " bytes)", b->len);
			if ((e = rt->Memcpy(buf, b->data, b->len, CUDART_MEMCPY_D2H))) {
				why = "cudaMemcpy D2H failed";
				printf("note: %s: %s\n", b->name, cudart_strerror(rt, e, eb, sizeof(eb)));
			} else if (memcmp(buf, a->data, a->len)) {
				why = "device bytes differ from the host map's";
			} else {
				XXH128_canonical_t c;

				XXH128_canonicalFromHash(&c, XXH3_128bits(buf, b->len));
				if (memcmp(c.digest, a->hash, 16))
					why = "device bytes do not match the tensor's hash";
			}
			free(buf);
		}
		if (why && bad++ < 5)
			printf("note: %s: tensor %zu %s (%s): %s\n", what, i, a->name, a->file, why);
		bytes += a->len;
	}
	check(!bad, "%s: %zu tensors, %" PRIu64 " bytes copied back from GPU %d equal the host map%s",
	      what, n, bytes, hwfs_map_device(dm), bad ? " (see notes)" : "");
	check(!unaligned, "%s: every device tensor is 256-byte aligned (%zu are not)", what,
	      unaligned);
}

/* ------------------------------------------------------------ subcommands */

static int cmd_probe(void)
{
	char why[512];
	size_t f = 0, t = 0;

	if (cudart_open(&rt, why, sizeof(why)) < 0) {
		printf("test-gpu needs a CUDA device: %s\n", why);
		return 1;
	}
	if (rt->SetDevice(0) || rt->MemGetInfo(&f, &t)) {
		printf("test-gpu needs a CUDA device: device 0 does not answer cudaMemGetInfo\n");
		return 1;
	}
	printf("CUDA: %d device(s), runtime %d.%d, driver %d.%d (%s); GPU 0: %.0f of %.0f MiB free\n",
	       rt->devices, rt->runtime / 1000, rt->runtime % 1000 / 10, rt->driver / 1000,
	       rt->driver % 1000 / 10, rt->path, f / MIB, t / MIB);
	return 0;
}

static int cmd_mkst(const char *file, const char *seed, const char *bytes)
{
	char err[512];

	if (stgen_write(file, strtoull(seed, NULL, 0), strtoull(bytes, NULL, 0), err,
			sizeof(err)) < 0) {
		fprintf(stderr, "hwfs-gputest: %s\n", err);
		return 1;
	}
	return 0;
}

static int cmd_pid(const char *mnt)
{
	struct hwfs *h = open_mount(mnt);
	json_t *st = call(h, "{\"op\":\"status\"}");

	if (!st || jint(st, "pid") <= 0)
		return 1;
	printf("%lld\n", jint(st, "pid"));
	json_decref(st);
	hwfs_close(h);
	return 0;
}

/* (a) The arena is registered with CUDA, and status says so. */
static int cmd_pinned(const char *mnt)
{
	struct hwfs *h = open_mount(mnt);
	json_t *st = call(h, "{\"op\":\"status\"}"), *store, *gpu, *devs;
	const char *pinned;

	if (!st)
		die("status failed");
	store = json_object_get(st, "store");
	gpu = json_object_get(st, "gpu");
	pinned = json_string_value(json_object_get(store, "pinned"));
	check(pinned && !strcmp(pinned, "cuda"), "status store.pinned is \"cuda\" (got %s; gpu_note: %s)",
	      pinned ? pinned : "nothing",
	      json_string_value(json_object_get(st, "gpu_note")) ?: "none");
	check(jint(store, "pinned_bytes") > 0 &&
		      jint(store, "pinned_bytes") >= jint(store, "capacity_bytes"),
	      "store.pinned_bytes %lld covers the capacity %lld", jint(store, "pinned_bytes"),
	      jint(store, "capacity_bytes"));
	check(jtrue(store, "preallocated"), "--pin implies a preallocated arena");
	check(json_is_object(gpu), "status has a gpu object");
	devs = json_object_get(gpu, "devices");
	check(json_array_size(devs) >= 1 && jint(json_array_get(devs, 0), "total_bytes") > 0,
	      "gpu.devices lists device 0 with its total_bytes");
	check(jint(gpu, "pinned_bytes") > 0 &&
		      jint(gpu, "pinned_bytes") == jint(store, "pinned_bytes"),
	      "gpu.pinned_bytes %lld equals store.pinned_bytes", jint(gpu, "pinned_bytes"));
	check(json_is_array(json_object_get(gpu, "loads")), "gpu.loads is an array");
	json_decref(st);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* Wait until the device's free memory is within @slack of @target (or the time is up). */
static uint64_t wait_free(uint64_t target, uint64_t slack)
{
	uint64_t f = dev_free();

	for (int ms = 0; ms < FREE_WAIT_MS && f + slack < target; ms += 50) {
		sleep_ms(50);
		f = dev_free();
	}
	return f;
}

/* (d) Device memory is taken by a load and given back by the unload, deferred by a gpumap. */
static int cmd_memory(const char *mnt, const char *v, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_map *hm, *dm, *dm2 = NULL;
	const char *env = getenv("GPU_TEST_SLACK_MIB");
	uint64_t slack = (env ? strtoull(env, NULL, 0) : 64) << 20, bytes, f0, f1, f2, f3;
	json_t *j;
	int r;

	cuda_open(gpu);
	if (hwfs_map(h, v, &hm) < 0)
		die("hwfs_map(%s): %s", v, hwfs_errmsg());
	bytes = map_bytes(hm);
	r = hwfs_unload(h, v, gpu);
	check(r == -ENOENT, "unload of %s before any load is ENOENT (%d: %s)", v, r, hwfs_errmsg());

	f0 = dev_free();
	r = hwfs_load(h, v, gpu, NULL, NULL);
	check(r == 0, "hwfs_load(%s, GPU %d) (%s)", v, gpu, r ? hwfs_errmsg() : "ok");
	f1 = dev_free();
	/* Signed: free memory that grew meanwhile must not wrap into a huge "taken". */
	check((int64_t)f0 - (int64_t)f1 >= (int64_t)bytes,
	      "the load took %.1f MiB of device memory for %.1f MiB of tensors",
	      ((double)f0 - f1) / MIB, bytes / MIB);
	r = hwfs_load(h, v, gpu, NULL, NULL);
	check(r == 0 && dev_free() + slack >= f1, "loading %s again is 0 and takes nothing more", v);

	r = hwfs_map_gpu(h, v, gpu, &dm);
	if (r < 0)
		die("hwfs_map_gpu(%s): %s", v, hwfs_errmsg());
	j = call(h, "{\"op\":\"unload\",\"version\":\"%s\",\"gpu\":%d}", v, gpu);
	check(j && jtrue(j, "ok") && jint(j, "pending_maps") == 1 && jint(j, "freed_bytes") == 0,
	      "unload with a gpumap open answers freed_bytes 0, pending_maps 1 (%lld, %lld)",
	      j ? jint(j, "freed_bytes") : -1, j ? jint(j, "pending_maps") : -1);
	json_decref(j);
	sleep_ms(500);
	f2 = dev_free();
	check((int64_t)f0 - (int64_t)f2 >= (int64_t)bytes,
	      "while the gpumap is open the memory stays taken (%.1f MiB)",
	      ((double)f0 - f2) / MIB);
	compare_maps(hm, dm, "gpumap after its version was unloaded");
	r = hwfs_map_gpu(h, v, gpu, &dm2);
	check(r == -ENOENT, "a new gpumap of the unloaded %s is ENOENT (%d: %s)", v, r,
	      hwfs_errmsg());
	if (r == 0)
		hwfs_unmap(dm2);
	hwfs_unmap(dm);
	f3 = wait_free(f0, slack);
	check(f3 + slack >= f0, "closing the last gpumap frees the device memory (%.1f MiB off)",
	      ((double)f0 - f3) / MIB);

	r = hwfs_load(h, v, gpu, NULL, NULL);
	check(r == 0 && dev_free() + bytes <= f0, "load %s again (%s)", v,
	      r ? hwfs_errmsg() : "ok");
	j = call(h, "{\"op\":\"unload\",\"version\":\"%s\",\"gpu\":%d}", v, gpu);
	check(j && jtrue(j, "ok") && jint(j, "pending_maps") == 0 &&
		      jint(j, "freed_bytes") >= (long long)bytes,
	      "unload without a gpumap frees at once: freed_bytes %lld >= %" PRIu64,
	      j ? jint(j, "freed_bytes") : -1, bytes);
	json_decref(j);
	f3 = wait_free(f0, slack);
	check(f3 + slack >= f0, "device memory back where it was (%.1f MiB off)",
	      ((double)f0 - f3) / MIB);
	r = hwfs_unload(h, v, gpu);
	check(r == -ENOENT, "a second unload is ENOENT (%d: %s)", r, hwfs_errmsg());
	hwfs_unmap(hm);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* (b) Bytes copied back from the device equal the host map's. */
static int cmd_compare(const char *mnt, const char *v, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_map *hm, *dm;
	int r;

	cuda_open(gpu);
	if (hwfs_map(h, v, &hm) < 0)
		die("hwfs_map(%s): %s", v, hwfs_errmsg());
	r = hwfs_map_gpu(h, v, gpu, &dm);
	check(r == 0, "hwfs_map_gpu(%s, GPU %d) (%s)", v, gpu, r ? hwfs_errmsg() : "ok");
	if (r < 0)
		return 1;
	check(hwfs_map_device(dm) == gpu && hwfs_map_device(hm) == -1,
	      "hwfs_map_device: %d for the device map, %d for the host map",
	      hwfs_map_device(dm), hwfs_map_device(hm));
	check(!strcmp(hwfs_map_digest(dm), hwfs_map_digest(hm)) &&
		      !strcmp(hwfs_map_version(dm), v),
	      "device map's version and digest are the host map's (%s)", hwfs_map_digest(dm));
	compare_maps(hm, dm, v);
	hwfs_unmap(dm);
	hwfs_unmap(hm);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* (c) Other processes open the same IPC handles while this one has them open. */
static int cmd_ipc(const char *self, const char *mnt, const char *v, int gpu, int n)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_map *hm, *dm;
	pid_t pids[16];
	char gs[16];
	int ok = 0;

	if (n < 1 || n > 16)
		die("ipc: N must be 1..16");
	cuda_open(gpu);
	if (hwfs_map(h, v, &hm) < 0 || hwfs_map_gpu(h, v, gpu, &dm) < 0)
		die("map %s: %s", v, hwfs_errmsg());
	snprintf(gs, sizeof(gs), "%d", gpu);
	for (int i = 0; i < n; i++) {
		char *argv[] = {(char *)self, "compare", (char *)mnt, (char *)v, gs, NULL};
		int e = posix_spawn(&pids[i], "/proc/self/exe", NULL, NULL, argv, environ);

		if (e)
			die("posix_spawn: %s", strerror(e));
	}
	for (int i = 0; i < n; i++) {
		int st = 0;

		if (waitpid(pids[i], &st, 0) == pids[i] && WIFEXITED(st) && !WEXITSTATUS(st))
			ok++;
	}
	check(ok == n, "%d of %d other processes mapped %s on GPU %d at once and compared equal",
	      ok, n, v, gpu);
	compare_maps(hm, dm, "this process's gpumap after the others closed theirs");
	hwfs_unmap(dm);
	hwfs_unmap(hm);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* The entry of gpu.loads for @v on @gpu in @st, or NULL. */
static json_t *find_load(json_t *st, const char *v, int gpu)
{
	json_t *loads = json_object_get(json_object_get(st, "gpu"), "loads"), *l;
	size_t i;

	json_array_foreach(loads, i, l) {
		const char *name = json_string_value(json_object_get(l, "version"));

		if (name && !strcmp(name, v) && jint(l, "gpu") == gpu)
			return l;
	}
	return NULL;
}

/* (e) A loaded version removed from the node keeps its device copy until unloaded. */
static int cmd_removed(const char *mnt, const char *v, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_map *hm, *dm, *dm2;
	struct hwfs_version *vs;
	size_t nv;
	int r, listed = 0;
	json_t *j, *l;

	cuda_open(gpu);
	if (hwfs_map(h, v, &hm) < 0 || hwfs_map_gpu(h, v, gpu, &dm) < 0)
		die("map %s: %s", v, hwfs_errmsg());
	j = call(h, "{\"op\":\"rm\",\"version\":\"%s\"}", v);
	check(j && jtrue(j, "ok"), "rm %s while it is loaded on GPU %d", v, gpu);
	json_decref(j);
	if (hwfs_versions(h, &vs, &nv) == 0) {
		for (size_t i = 0; i < nv; i++)
			listed |= !strcmp(vs[i].name, v);
		hwfs_versions_free(vs, nv);
	}
	check(!listed, "%s is no longer listed", v);
	j = call(h, "{\"op\":\"status\"}");
	l = j ? find_load(j, v, gpu) : NULL;
	check(l && jtrue(l, "removed"), "status gpu.loads still has %s on GPU %d, \"removed\": true", v,
	      gpu);
	json_decref(j);
	compare_maps(hm, dm, "gpumap opened before the rm");
	r = hwfs_map_gpu(h, v, gpu, &dm2);
	check(r == 0, "a new gpumap of the removed %s (%s)", v, r ? hwfs_errmsg() : "ok");
	if (r == 0) {
		compare_maps(hm, dm2, "gpumap opened after the rm");
		hwfs_unmap(dm2);
	}
	hwfs_unmap(dm);
	hwfs_unmap(hm);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* DLPack's dtype of a safetensors dtype, as hwfs maps it (docs/gpu.md). */
static int dl_dtype(const char *st, DLDataType *out)
{
	static const struct {
		const char *st;
		uint8_t code, bits;
	} map[] = {
		{"F64", kDLFloat, 64}, {"F32", kDLFloat, 32}, {"F16", kDLFloat, 16},
		{"BF16", kDLBfloat, 16}, {"I8", kDLInt, 8}, {"I16", kDLInt, 16},
		{"I32", kDLInt, 32}, {"I64", kDLInt, 64}, {"U8", kDLUInt, 8},
		{"U16", kDLUInt, 16}, {"U32", kDLUInt, 32}, {"U64", kDLUInt, 64},
		{"BOOL", 6 /* kDLBool */, 8},
	};

	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strcmp(map[i].st, st)) {
			out->code = map[i].code;
			out->bits = map[i].bits;
			out->lanes = 1;
			return 0;
		}
	return -ENOTSUP;
}

/* Check the DLPack tensors of @m against its tensors; they are returned in @out. */
static void check_dlpack(struct hwfs_map *m, DLManagedTensor **out, int dev_type, int dev_id,
			 const char *what)
{
	size_t n = hwfs_map_count(m), bad = 0;

	for (size_t i = 0; i < n; i++) {
		const struct hwfs_tensor *t = hwfs_map_tensor(m, i);
		const char *why = NULL;
		DLDataType want;
		DLTensor *d;
		int r = hwfs_map_dlpack(m, i, &out[i]);

		if (r < 0) {
			out[i] = NULL;
			why = hwfs_errmsg();
		} else {
			d = &out[i]->dl_tensor;
			dl_dtype(t->dtype, &want);
			if ((int)d->device.device_type != dev_type || d->device.device_id != dev_id)
				why = "wrong device";
			else if ((const char *)d->data + d->byte_offset != (const char *)t->data)
				why = "data + byte_offset is not the tensor's pointer";
			else if (d->ndim != (int)t->ndim ||
				 (t->ndim && memcmp(d->shape, t->shape, t->ndim * sizeof(int64_t))))
				why = "ndim or shape differs";
			else if (d->strides)
				why = "strides not NULL";
			else if (d->dtype.code != want.code || d->dtype.bits != want.bits ||
				 d->dtype.lanes != 1)
				why = "dtype differs";
			else if (!out[i]->deleter)
				why = "no deleter";
		}
		if (why && bad++ < 5)
			printf("note: %s: tensor %s (%s): %s\n", what, t->name, t->dtype, why);
	}
	check(!bad, "%s: %zu DLPack tensors (device type %d, id %d, data, dtype, shape, strides)",
	      what, n, dev_type, dev_id);
}

/* (f) DLPack tensors of a device map, and their reference on the map. */
static int cmd_dlpack(const char *mnt, const char *v, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_map *hm, *dm;
	DLManagedTensor **dt, **ht;
	DLManagedTensor *extra = NULL;
	size_t n, bad = 0;
	int r;

	cuda_open(gpu);
	if (hwfs_map(h, v, &hm) < 0 || hwfs_map_gpu(h, v, gpu, &dm) < 0)
		die("map %s: %s", v, hwfs_errmsg());
	n = hwfs_map_count(hm);
	dt = calloc(n, sizeof(*dt));
	ht = calloc(n, sizeof(*ht));
	if (!dt || !ht)
		die("out of memory");
	check_dlpack(dm, dt, kDLCUDA, gpu, "device map");
	check_dlpack(hm, ht, kDLCPU, 0, "host map");
	r = hwfs_map_dlpack(dm, n, &extra);
	if (r == 0)
		extra->deleter(extra);
	check(r == -ERANGE, "hwfs_map_dlpack of tensor %zu of %zu is ERANGE (%d)", n, n, r);

	/* The tensors hold the map: after hwfs_unmap() their device bytes still read back. */
	hwfs_unmap(dm);
	for (size_t i = 0; i < n; i++) {
		const struct hwfs_tensor *t = hwfs_map_tensor(hm, i);
		uint8_t *buf = malloc(t->len + 1);

		if (!dt[i] || !buf || rt->Memcpy(buf, dt[i]->dl_tensor.data, t->len,
						 CUDART_MEMCPY_D2H) ||
		    memcmp(buf, t->data, t->len))
			bad++;
		free(buf);
	}
	check(!bad, "after hwfs_unmap of the device map its DLPack tensors still read back equal "
		    "(%zu bad)", bad);
	for (size_t i = 0; i < n; i++) {
		if (dt[i])
			dt[i]->deleter(dt[i]);
		if (ht[i])
			ht[i]->deleter(ht[i]);
	}
	hwfs_unmap(hm);
	free(dt);
	free(ht);
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* (g) An engine whose readiness is the device load: registered until killed. */
static int cmd_engine(const char *mnt, const char *name, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	struct hwfs_watch *w;
	struct hwfs_event ev;
	char *cur = NULL;
	int r = hwfs_watch_open_gpu(h, name, gpu, &cur, &w);

	if (r < 0) {
		printf("engine %s: hwfs_watch_open_gpu(GPU %d): %s\n", name, gpu, hwfs_errmsg());
		return 1;
	}
	printf("engine %s registered on GPU %d (current: %s)\n", name, gpu, cur ? cur : "none");
	free(cur);
	while ((r = hwfs_watch_next(w, -1, &ev)) == 0 || r == -EPROTO || r == -ETIMEDOUT)
		if (r == 0)
			printf("engine %s: event %d %s\n", name, (int)ev.type, ev.version);
	printf("engine %s: the stream ended (%d)\n", name, r);
	hwfs_watch_close(w);
	hwfs_close(h);
	return 0;
}

/* (g) V is resident on GPU (status gpu.loads) and current points at it. */
static int cmd_resident(const char *mnt, const char *v, int gpu)
{
	struct hwfs *h = open_mount(mnt);
	json_t *st = call(h, "{\"op\":\"status\"}"), *l;
	char path[PATH_MAX], want[PATH_MAX], link[PATH_MAX];
	const char *state;
	ssize_t n;

	if (!st)
		die("status failed");
	l = find_load(st, v, gpu);
	state = l ? json_string_value(json_object_get(l, "state")) : NULL;
	check(state && !strcmp(state, "loaded"), "status gpu.loads: %s on GPU %d is \"loaded\" (%s)",
	      v, gpu, state ? state : "not listed");
	json_decref(st);
	snprintf(path, sizeof(path), "%s/current", mnt);
	snprintf(want, sizeof(want), "versions/%s", v);
	n = readlink(path, link, sizeof(link) - 1);
	link[n > 0 ? n : 0] = 0;
	check(n > 0 && !strcmp(link, want), "%s -> %s (it points at %s)", path, want,
	      n > 0 ? link : "nothing");
	hwfs_close(h);
	return failures ? 1 : 0;
}

/* (h) A load's answer names its source: the pinned arena or a pageable one. */
static int cmd_source(const char *mnt, const char *v, int gpu, const char *want)
{
	struct hwfs *h = open_mount(mnt);
	const char *src;
	json_t *j;
	int r = hwfs_unload(h, v, gpu);

	if (r < 0 && r != -ENOENT)
		die("hwfs_unload(%s): %s", v, hwfs_errmsg());
	j = call(h, "{\"op\":\"load\",\"version\":\"%s\",\"gpu\":%d}", v, gpu);
	check(j && jtrue(j, "ok") && !jtrue(j, "already"), "load %s on GPU %d (a fresh copy)", v,
	      gpu);
	src = j ? json_string_value(json_object_get(j, "source")) : NULL;
	check(src && !strcmp(src, want), "the load answer's \"source\" is \"%s\" (got %s)", want,
	      src ? src : "nothing");
	json_decref(j);
	hwfs_close(h);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "";

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(c, "probe") && argc == 2)
		return cmd_probe();
	if (!strcmp(c, "mkst") && argc == 5)
		return cmd_mkst(argv[2], argv[3], argv[4]);
	if (!strcmp(c, "pid") && argc == 3)
		return cmd_pid(argv[2]);
	if (!strcmp(c, "pinned") && argc == 3)
		return cmd_pinned(argv[2]);
	if (argc >= 5) {
		int gpu = atoi(argv[4]);

		if (!strcmp(c, "memory") && argc == 5)
			return cmd_memory(argv[2], argv[3], gpu);
		if (!strcmp(c, "compare") && argc == 5)
			return cmd_compare(argv[2], argv[3], gpu);
		if (!strcmp(c, "removed") && argc == 5)
			return cmd_removed(argv[2], argv[3], gpu);
		if (!strcmp(c, "dlpack") && argc == 5)
			return cmd_dlpack(argv[2], argv[3], gpu);
		if (!strcmp(c, "engine") && argc == 5)
			return cmd_engine(argv[2], argv[3], gpu);
		if (!strcmp(c, "resident") && argc == 5)
			return cmd_resident(argv[2], argv[3], gpu);
		if (!strcmp(c, "source") && argc == 6)
			return cmd_source(argv[2], argv[3], gpu, argv[5]);
		if (!strcmp(c, "ipc") && argc == 6)
			return cmd_ipc(argv[0], argv[2], argv[3], gpu, atoi(argv[5]));
	}
	fprintf(stderr, "%s\n", USAGE);
	return 2;
}
