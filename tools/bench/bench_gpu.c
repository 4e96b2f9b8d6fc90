/*
 * bench_gpu.c — hwfs-gpubench, the host-to-device benchmark of the GPU plane
 * (tools/bench/bench_gpu.sh sets up the mounts and runs it; docs/gpu.md,
 * "Benchmark", says what the figures mean).
 *
 *   hwfs-gpubench mkst FILE SEED BYTES
 *   hwfs-gpubench run --pinned MNT --pageable MNT2 --version V [--gpu N]
 *                     [--streams 4] [--piece BYTES] [--reps 3] [--ipc 20]
 *
 * `run` measures, for version V published on both mounts (MNT mounted with
 * --pin, MNT2 without):
 *   (i)   `load` from the pinned arena: the daemon's own "seconds" of the
 *         final answer, and the wall clock from the request to that answer
 *         (the answer comes once every bucket is resident);
 *   (ii)  cudaMemcpyAsync from one cudaMallocHost buffer of the same bytes;
 *   (iii) the same from a malloc'd (pageable, touched) buffer;
 *   (iv)  `load` from the arena of MNT2 (not pinned).
 * The baselines copy the way the loader does: into device buckets of the
 * sizes the load of (i) made (read from its gpumap answer), buckets
 * round-robin over --streams streams (the daemon's gpu_streams, default 4),
 * each bucket in pieces of --piece bytes (default 64 MiB, max_shard: the
 * largest contiguous run of a version in the arena), all issued before one
 * wait for every stream.  Each baseline gives two figures: "like-for-like",
 * timing what the load's "seconds" times (cudaMemGetInfo, the buckets'
 * cudaMalloc, stream creation and destruction, the copies, the IPC handles),
 * and "pure copy" (first copy issued to the last stream done).  Each figure
 * is the median of --reps runs after one untimed warm-up (loads: the device
 * copy is unloaded between runs).  Rates are GB/s (1e9 bytes per second).
 *
 * IPC: the whole hwfs_map_gpu() + hwfs_unmap() of the loaded version (the
 * control round trip, the opens, the table), --ipc times after one untimed
 * first map (this process's first IPC opens; its CUDA context exists
 * already, from cudaSetDevice); and, apart, the cudaIpcOpenMemHandle calls
 * alone, on the handles of a gpumap answer, --ipc times: the median per map
 * and per bucket.
 *
 * Output: a table, the ratio (i)/(ii like-for-like) against the target
 * (>= 0.9) and (i)/(ii pure copy), and one JSON line starting
 * {"bench": "gpu", ...}.  Exit 0 when every measure ran
 * (a missed target is reported, not an error), 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudart.h"
#include "hwfs.h"
#include "stgen.h"

#define USAGE                                                                              \
	"usage: hwfs-gpubench mkst FILE SEED BYTES\n"                                        \
	"       hwfs-gpubench run --pinned MNT --pageable MNT2 --version V [--gpu N]\n"      \
	"                         [--streams 4] [--piece BYTES] [--reps 3] [--ipc 20]"
#define MAX_REPS 64
#define MAX_STREAMS 64
#define MAX_BUCKETS 4096
#define TARGET_RATIO 0.9

static struct cudart *rt;

static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "hwfs-gpubench: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
	double s[1024]; /* n <= 1024: --reps and --ipc are capped */

	if (n <= 0)
		return 0;
	memcpy(s, v, n * sizeof(*v));
	qsort(s, n, sizeof(*s), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void cu(cudart_err e, const char *what)
{
	char eb[256];

	if (e)
		die("%s: %s", what, cudart_strerror(rt, e, eb, sizeof(eb)));
}

static json_t *call(struct hwfs *h, const char *fmt, ...)
{
	char req[1024], *reply = NULL;
	va_list ap;
	json_t *j;

	va_start(ap, fmt);
	vsnprintf(req, sizeof(req), fmt, ap);
	va_end(ap);
	if (hwfs_call(h, req, NULL, NULL, &reply) < 0)
		die("%s: %s", req, hwfs_errmsg());
	j = json_loads(reply, 0, NULL);
	if (!j)
		die("%s: unparsable answer %s", req, reply);
	free(reply);
	return j;
}

/* What the loads of one arena measured. */
struct load_result {
	const char *source;   /* the answer's "source" */
	uint64_t bytes;
	long long tensors, buckets;
	double secs[MAX_REPS], wall[MAX_REPS];
};

/* Load @v on @gpu @reps times (after a warm-up), unloading in between; leaves it loaded. */
static void bench_load(struct hwfs *h, const char *v, int gpu, int reps, struct load_result *lr)
{
	for (int r = -1; r < reps; r++) {
		json_t *j = call(h, "{\"op\":\"unload\",\"version\":\"%s\",\"gpu\":%d}", v, gpu);
		double t0;

		json_decref(j);
		t0 = now();
		j = call(h, "{\"op\":\"load\",\"version\":\"%s\",\"gpu\":%d}", v, gpu);
		if (!json_is_true(json_object_get(j, "ok")))
			die("load %s on GPU %d: %s", v, gpu,
			    json_string_value(json_object_get(j, "error")) ?: "refused");
		if (json_is_true(json_object_get(j, "already")))
			die("load %s: the unload before it did not take (\"already\": true)", v);
		if (r >= 0) {
			lr->wall[r] = now() - t0;
			lr->secs[r] = json_number_value(json_object_get(j, "seconds"));
		}
		lr->bytes = json_integer_value(json_object_get(j, "bytes"));
		lr->tensors = json_integer_value(json_object_get(j, "tensors"));
		lr->buckets = json_integer_value(json_object_get(j, "buckets"));
		lr->source = json_string_value(json_object_get(j, "source"))
				     ? strdup(json_string_value(json_object_get(j, "source")))
				     : "?";
		json_decref(j);
	}
}

/* The sizes of the buckets of @v's load on @gpu, from its gpumap answer; returns their count. */
static int bucket_sizes(struct hwfs *h, const char *v, int gpu, uint64_t *sizes)
{
	json_t *j = call(h, "{\"op\":\"gpumap\",\"version\":\"%s\",\"gpu\":%d}", v, gpu), *b;
	size_t i;
	int n = 0;

	json_array_foreach(json_object_get(j, "buckets"), i, b) {
		if (n < MAX_BUCKETS)
			sizes[n++] = json_integer_value(json_object_get(b, "bytes"));
	}
	json_decref(j);
	return n;
}

/*
 * Copy @bytes from @host into device buckets of @sizes (@nb of them),
 * bucket b on stream b % @ns, in pieces of @piece bytes; @reps timed runs
 * after a warm-up.  Each run does what the loader's timed region does
 * (gpu/devload.c): cudaMemGetInfo, a cudaMalloc per bucket, @ns streams
 * created, the copies, the waits, the streams destroyed and a
 * cudaIpcGetMemHandle per bucket; @full gets that whole time ("like for
 * like" with the load's "seconds"), @copy the time from the first
 * cudaMemcpyAsync to the end of the last wait (the pure copy).  The buckets
 * are freed outside the timing, as the load keeps its buckets.
 */
static void bench_memcpy(const uint8_t *host, uint64_t bytes, const uint64_t *sizes, int nb,
			 int ns, uint64_t piece, int reps, double *full, double *copy)
{
	void **dev = calloc(nb, sizeof(*dev));
	cudart_stream s[MAX_STREAMS];

	if (!dev)
		die("out of memory");
	for (int r = -1; r < reps; r++) {
		uint64_t off = 0;
		size_t fb, tb;
		double t0, c0, c1, t1;
		cudart_ipc_handle ih;

		cu(rt->DeviceSynchronize(), "cudaDeviceSynchronize");
		t0 = now();
		cu(rt->MemGetInfo(&fb, &tb), "cudaMemGetInfo");
		for (int b = 0; b < nb; b++)
			cu(rt->Malloc(&dev[b], sizes[b]), "cudaMalloc of a bucket");
		for (int i = 0; i < ns; i++)
			cu(rt->StreamCreateWithFlags(&s[i], CUDART_STREAM_NON_BLOCKING),
			   "cudaStreamCreate");
		c0 = now();
		for (int b = 0; b < nb && off < bytes; b++) {
			uint64_t in = sizes[b] < bytes - off ? sizes[b] : bytes - off;

			for (uint64_t p = 0; p < in; p += piece) {
				uint64_t len = in - p < piece ? in - p : piece;

				cu(rt->MemcpyAsync((uint8_t *)dev[b] + p, host + off + p, len,
						   CUDART_MEMCPY_H2D, s[b % ns]),
				   "cudaMemcpyAsync");
			}
			off += in;
		}
		for (int i = 0; i < ns; i++)
			cu(rt->StreamSynchronize(s[i]), "cudaStreamSynchronize");
		c1 = now();
		for (int i = 0; i < ns; i++)
			rt->StreamDestroy(s[i]);
		for (int b = 0; b < nb; b++)
			cu(rt->IpcGetMemHandle(&ih, dev[b]), "cudaIpcGetMemHandle");
		t1 = now();
		if (r >= 0) {
			full[r] = t1 - t0;
			copy[r] = c1 - c0;
		}
		for (int b = 0; b < nb; b++)
			rt->Free(dev[b]);
	}
	free(dev);
}

/* One hex digit's value, or -1. */
static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/*
 * Time only the cudaIpcOpenMemHandle calls of @v's buckets on @gpu: the
 * handles come from a gpumap answer (the load stays loaded meanwhile), each
 * run opens every bucket (timed) and closes them (not timed); @n runs after
 * an untimed one, the total per run into @out.  Returns the bucket count.
 */
static int bench_ipc_open(struct hwfs *h, const char *v, int gpu, int n, double *out)
{
	json_t *j = call(h, "{\"op\":\"gpumap\",\"version\":\"%s\",\"gpu\":%d}", v, gpu), *b;
	cudart_ipc_handle *hs;
	void **ptrs;
	size_t i, nb = json_array_size(json_object_get(j, "buckets"));

	hs = calloc(nb ? nb : 1, sizeof(*hs));
	ptrs = calloc(nb ? nb : 1, sizeof(*ptrs));
	if (!hs || !ptrs)
		die("out of memory");
	json_array_foreach(json_object_get(j, "buckets"), i, b) {
		const char *hex = json_string_value(json_object_get(b, "handle"));

		if (!hex || strlen(hex) != 2 * CUDART_IPC_HANDLE_SIZE)
			die("gpumap answer: bucket %zu has no 128-hex-digit handle", i);
		for (int k = 0; k < CUDART_IPC_HANDLE_SIZE; k++) {
			int hi = hexval(hex[2 * k]), lo = hexval(hex[2 * k + 1]);

			if (hi < 0 || lo < 0)
				die("gpumap answer: bucket %zu's handle is not lowercase hex", i);
			hs[i].reserved[k] = (char)(hi << 4 | lo);
		}
	}
	json_decref(j);
	for (int r = -1; r < n; r++) {
		double t0 = now();

		for (i = 0; i < nb; i++)
			cu(rt->IpcOpenMemHandle(&ptrs[i], hs[i], CUDART_IPC_LAZY_PEER_ACCESS),
			   "cudaIpcOpenMemHandle");
		if (r >= 0)
			out[r] = now() - t0;
		for (i = 0; i < nb; i++)
			cu(rt->IpcCloseMemHandle(ptrs[i]), "cudaIpcCloseMemHandle");
	}
	free(hs);
	free(ptrs);
	return (int)nb;
}

static double gbps(uint64_t bytes, double s)
{
	return s > 0 ? bytes / s / 1e9 : 0;
}

/* One run of the benchmark: its parameters and what it measured. */
struct gpu_run {
	const char *v;                  /* the version loaded */
	int gpu, ns, reps, nipc;        /* device, streams, repetitions, IPC samples */
	uint64_t piece;                 /* the baselines' bytes per cudaMemcpyAsync */
	uint64_t *sizes;                /* the gpumap answer's bucket sizes */
	int nb, nb_open;                /* its buckets; those bench_ipc_open() opened */
	struct load_result pin, page;   /* (i) and (iv) */
	double t_pinned[MAX_REPS], t_page[MAX_REPS]; /* (ii), (iii) like-for-like */
	double c_pinned[MAX_REPS], c_page[MAX_REPS]; /* (ii), (iii) pure copy */
	double ipc[1024], ipc_open[1024], first_ipc;
};

/* IPC latency while the version is loaded on @hp: hwfs_map_gpu + hwfs_unmap, then the opens alone. */
static void bench_ipc(struct hwfs *hp, struct gpu_run *g)
{
	for (int i = -1; i < g->nipc; i++) {
		struct hwfs_map *m;
		double t0 = now();

		if (hwfs_map_gpu(hp, g->v, g->gpu, &m) < 0)
			die("hwfs_map_gpu(%s): %s", g->v, hwfs_errmsg());
		if (i < 0)
			g->first_ipc = now() - t0;
		else
			g->ipc[i] = now() - t0;
		hwfs_unmap(m);
	}
	g->nb_open = bench_ipc_open(hp, g->v, g->gpu, g->nipc, g->ipc_open);
}

/* (ii) and (iii) the baselines, into buckets of the same sizes: pinned, then pageable host memory. */
static void bench_baselines(struct gpu_run *g)
{
	uint8_t *hbuf;

	cu(rt->MallocHost((void **)&hbuf, g->pin.bytes), "cudaMallocHost");
	memset(hbuf, 0x5a, g->pin.bytes);
	bench_memcpy(hbuf, g->pin.bytes, g->sizes, g->nb, g->ns, g->piece, g->reps, g->t_pinned,
		     g->c_pinned);
	rt->FreeHost(hbuf);
	hbuf = malloc(g->pin.bytes);
	if (!hbuf)
		die("out of memory (%" PRIu64 " bytes)", g->pin.bytes);
	memset(hbuf, 0x5a, g->pin.bytes);
	bench_memcpy(hbuf, g->pin.bytes, g->sizes, g->nb, g->ns, g->piece, g->reps, g->t_page,
		     g->c_page);
	free(hbuf);
}

/* The table, the ratio against its target, the IPC latencies, and the same as one JSON line. */
static void print_results(struct gpu_run *g)
{
	double s_pin = median(g->pin.secs, g->reps), w_pin = median(g->pin.wall, g->reps);
	double s_page = median(g->page.secs, g->reps), w_page = median(g->page.wall, g->reps);
	double m_pin = median(g->t_pinned, g->reps), m_page = median(g->t_page, g->reps);
	double cp_pin = median(g->c_pinned, g->reps), cp_page = median(g->c_page, g->reps);
	double ipc_med = median(g->ipc, g->nipc), open_med = median(g->ipc_open, g->nipc);
	double ratio = s_pin > 0 ? m_pin / s_pin : 0, ratio_copy = s_pin > 0 ? cp_pin / s_pin : 0;
	uint64_t B = g->pin.bytes;

#define ROW(label, sec) \
	printf("  %-58s %8.2f %9.3f %8.2f\n", label, gbps(B, sec), sec, (sec) > 0 ? m_pin / (sec) : 0)
	printf("hwfs GPU benchmark: version %s, %" PRIu64 " bytes (%.2f GB, %.2f GiB) in %lld tensors, "
	       "%d buckets (largest %.0f MiB), GPU %d, %d streams, pieces of %.0f MiB, median of %d "
	       "runs\n", g->v, B, B / 1e9, B / 1073741824.0, g->pin.tensors, g->nb, g->sizes[0] / 1048576.0, g->gpu,
	       g->ns, g->piece / 1048576.0, g->reps);
	printf("  rates in GB/s = 1e9 bytes per second; \"vs (ii)\" = time of (ii) like-for-like / "
	       "time of the row\n");
	printf("  %-58s %8s %9s %8s\n", "host-to-device path", "GB/s", "seconds", "vs (ii)");
	ROW("(i)   hwfs load, pinned arena (daemon \"seconds\")", s_pin);
	ROW("(i)   hwfs load, pinned arena (wall, request to answer)", w_pin);
	ROW("(ii)  cudaMallocHost source, like-for-like (alloc+copy+IPC)", m_pin);
	ROW("(ii)  cudaMallocHost source, pure copy", cp_pin);
	ROW("(iii) malloc (pageable) source, like-for-like", m_page);
	ROW("(iii) malloc (pageable) source, pure copy", cp_page);
	ROW("(iv)  hwfs load, pageable arena (daemon \"seconds\")", s_page);
	ROW("(iv)  hwfs load, pageable arena (wall)", w_page);
#undef ROW
	printf("  like-for-like: cudaMemGetInfo, a cudaMalloc per bucket, %d streams created and "
	       "destroyed, the copies and a cudaIpcGetMemHandle per bucket, as the load's \"seconds\" "
	       "counts them; pure copy: first cudaMemcpyAsync to the last stream's end\n", g->ns);
	printf("  sources reported by the loads: (i) %s, (iv) %s\n", g->pin.source, g->page.source);
	printf("ratio (i)/(ii) like-for-like = %.2f: target >= %.2f %s; (i)/(ii) pure copy = %.2f\n",
	       ratio, TARGET_RATIO, ratio >= TARGET_RATIO ? "MET" : "NOT MET", ratio_copy);
	printf("IPC: hwfs_map_gpu + hwfs_unmap (whole call, %d buckets): median %.3f ms over %d "
	       "(the untimed first map, this process's first IPC opens: %.1f ms)\n", g->nb, ipc_med * 1e3,
	       g->nipc, g->first_ipc * 1e3);
	printf("IPC: cudaIpcOpenMemHandle alone, every bucket of the gpumap answer: median %.3f ms "
	       "per map over %d, %.1f us per bucket (%d buckets)\n", open_med * 1e3, g->nipc,
	       g->nb_open > 0 ? open_med * 1e6 / g->nb_open : 0, g->nb_open);
	printf("{\"bench\": \"gpu\", \"version\": \"%s\", \"bytes\": %" PRIu64 ", \"tensors\": %lld, "
	       "\"buckets\": %d, \"gpu\": %d, \"streams\": %d, \"piece_bytes\": %" PRIu64
	       ", \"reps\": %d, \"units\": \"GB/s = 1e9 B/s\", \"load_pinned_gbps\": %.3f, "
	       "\"load_pinned_wall_gbps\": %.3f, \"memcpy_pinned_like_for_like_gbps\": %.3f, "
	       "\"memcpy_pinned_copy_gbps\": %.3f, \"memcpy_pageable_like_for_like_gbps\": %.3f, "
	       "\"memcpy_pageable_copy_gbps\": %.3f, \"load_pageable_gbps\": %.3f, "
	       "\"load_pageable_wall_gbps\": %.3f, \"ratio_load_to_pinned_memcpy\": %.3f, "
	       "\"ratio_load_to_pinned_copy\": %.3f, \"target\": %.2f, \"met\": %s, "
	       "\"source_pinned\": \"%s\", \"source_pageable\": \"%s\", "
	       "\"map_gpu_ms_median\": %.4f, \"map_gpu_ms_first\": %.3f, "
	       "\"ipc_open_ms_median\": %.4f, \"ipc_open_us_per_bucket\": %.2f, "
	       "\"ipc_samples\": %d}\n",
	       g->v, B, g->pin.tensors, g->nb, g->gpu, g->ns, g->piece, g->reps, gbps(B, s_pin), gbps(B, w_pin),
	       gbps(B, m_pin), gbps(B, cp_pin), gbps(B, m_page), gbps(B, cp_page), gbps(B, s_page),
	       gbps(B, w_page), ratio, ratio_copy, TARGET_RATIO,
	       ratio >= TARGET_RATIO ? "true" : "false", g->pin.source, g->page.source, ipc_med * 1e3,
	       g->first_ipc * 1e3, open_med * 1e3, g->nb_open > 0 ? open_med * 1e6 / g->nb_open : 0, g->nipc);
}

static int cmd_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{"pinned", 1, NULL, 'p'}, {"pageable", 1, NULL, 'q'}, {"version", 1, NULL, 'v'},
		{"gpu", 1, NULL, 'g'},    {"streams", 1, NULL, 's'},  {"piece", 1, NULL, 'c'},
		{"reps", 1, NULL, 'r'},   {"ipc", 1, NULL, 'i'},      {NULL, 0, NULL, 0},
	};
	struct gpu_run g = {.ns = 4, .reps = 3, .nipc = 20, .piece = 64ull << 20};
	const char *pmnt = NULL, *qmnt = NULL;
	uint64_t bsum = 0;
	char why[512];
	struct hwfs *hp, *hq;
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'p': pmnt = optarg; break;
		case 'q': qmnt = optarg; break;
		case 'v': g.v = optarg; break;
		case 'g': g.gpu = atoi(optarg); break;
		case 's': g.ns = atoi(optarg); break;
		case 'c': g.piece = strtoull(optarg, NULL, 0); break;
		case 'r': g.reps = atoi(optarg); break;
		case 'i': g.nipc = atoi(optarg); break;
		default: die("%s", USAGE);
		}
	}
	if (!pmnt || !qmnt || !g.v || g.ns < 1 || g.ns > MAX_STREAMS || g.reps < 1 ||
	    g.reps > MAX_REPS || g.nipc < 1 || g.nipc > 1024 || g.piece < 4096)
		die("%s", USAGE);
	if (cudart_open(&rt, why, sizeof(why)) < 0)
		die("bench-gpu needs a CUDA device: %s", why);
	cu(rt->SetDevice(g.gpu), "cudaSetDevice");
	if (hwfs_open(pmnt, &hp) < 0 || hwfs_open(qmnt, &hq) < 0)
		die("hwfs_open: %s", hwfs_errmsg());

	/* (i) the pinned arena, then the IPC latency while it is loaded. */
	bench_load(hp, g.v, g.gpu, g.reps, &g.pin);
	g.sizes = calloc(MAX_BUCKETS, sizeof(*g.sizes));
	if (!g.sizes)
		die("out of memory");
	g.nb = bucket_sizes(hp, g.v, g.gpu, g.sizes);
	for (int b = 0; b < g.nb; b++)
		bsum += g.sizes[b];
	if (g.nb < 1 || bsum < g.pin.bytes)
		die("the gpumap answer lists %d buckets of %" PRIu64 " bytes for %" PRIu64
		    " bytes of tensors", g.nb, bsum, g.pin.bytes);
	bench_ipc(hp, &g);
	json_decref(call(hp, "{\"op\":\"unload\",\"version\":\"%s\",\"gpu\":%d}", g.v, g.gpu));

	/* (iv) the pageable arena. */
	bench_load(hq, g.v, g.gpu, g.reps, &g.page);
	json_decref(call(hq, "{\"op\":\"unload\",\"version\":\"%s\",\"gpu\":%d}", g.v, g.gpu));

	bench_baselines(&g);
	print_results(&g);
	free(g.sizes);
	hwfs_close(hp);
	hwfs_close(hq);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 5 && !strcmp(argv[1], "mkst")) {
		char err[512];

		if (stgen_write(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0),
				err, sizeof(err)) < 0)
			die("%s", err);
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	fprintf(stderr, "%s\n", USAGE);
	return 2;
}
