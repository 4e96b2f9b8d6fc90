/*
 * metrics.c — the process's instruments (hwfs_nm, hwfs_cm), histogram
 * observation, and the Prometheus text format 0.0.4 writer that /metrics
 * serves (fs/common/http.c carries it; fs/daemon/daemon_http.c and the
 * coordinator add the values only they know, such as store usage).
 *
 * Everything here is lock-free: observation is a few relaxed atomic adds,
 * and exposition loads each field once.  A histogram read while observations
 * land may show a _count one ahead of a bucket: Prometheus tolerates that
 * (the next scrape agrees), and it is the price of never locking.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#ifndef HWFS_VERSION
#define HWFS_VERSION "1.0.0"
#endif

/* From 1 ms to 5 min: a FUSE-side flip is milliseconds, a replication minutes. */
const double hwfs_hist_le[HWFS_HIST_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
						 0.1,   0.25,   0.5,   1,    2.5,   5,
						 10,    30,     60,    300};

const char *const hwfs_commit_outcome_name[HWFS_COMMIT_N] = {"committed", "refused", "failed"};

struct hwfs_node_metrics hwfs_nm;
struct hwfs_coord_metrics hwfs_cm;

static const char *const fuse_op_name[HWFS_FOP_N] = {
#define HWFS_FOP_NAME(n) #n,
	HWFS_FUSE_OPS(HWFS_FOP_NAME)
#undef HWFS_FOP_NAME
};

void hwfs_hist_observe_ns(struct hwfs_hist *h, uint64_t ns)
{
	double s = (double)ns / 1e9;
	unsigned i = 0;

	while (i < HWFS_HIST_BUCKETS && s > hwfs_hist_le[i])
		i++;
	hwfs_count(&h->b[i], 1);
	hwfs_count(&h->sum_ns, ns);
}

/* ------------------------------------------------------------- the buffer */

/* Make room for @n more bytes (and a NUL) in @b; 0 or -1 (oom set). */
static int mbuf_reserve(struct mbuf *b, size_t n)
{
	size_t cap;
	char *p;

	if (b->oom)
		return -1;
	if (b->len + n + 1 <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + n + 1)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = 1;
		return -1;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

void mbuf_printf(struct mbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || mbuf_reserve(b, (size_t)n) < 0)
		return;
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

char *mbuf_take(struct mbuf *b)
{
	char *p = b->p;

	if (b->oom) {
		free(p);
		p = NULL;
	}
	*b = (struct mbuf){0};
	return p;
}

void mbuf_label_value(struct mbuf *b, const char *v)
{
	size_t n = strlen(v);

	if (mbuf_reserve(b, 2 * n) < 0)
		return;
	for (; *v; v++) {
		if (*v == '\\' || *v == '"') {
			b->p[b->len++] = '\\';
			b->p[b->len++] = *v;
		} else if (*v == '\n') {
			b->p[b->len++] = '\\';
			b->p[b->len++] = 'n';
		} else {
			b->p[b->len++] = *v;
		}
	}
	b->p[b->len] = '\0';
}

/* ------------------------------------------------------------- exposition */

void metrics_family(struct mbuf *b, const char *name, const char *type, const char *help)
{
	mbuf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* "name{lk="lv"" — the caller closes the brace (or adds more labels). */
static void open_labels(struct mbuf *b, const char *name, const char *suffix, const char *lk,
			const char *lv)
{
	mbuf_printf(b, "%s%s{", name, suffix);
	if (lk) {
		mbuf_printf(b, "%s=\"", lk);
		mbuf_label_value(b, lv);
		mbuf_printf(b, "\"");
	}
}

void metrics_sample_u64(struct mbuf *b, const char *name, const char *lk, const char *lv,
			uint64_t v)
{
	if (lk) {
		open_labels(b, name, "", lk, lv);
		mbuf_printf(b, "} %llu\n", (unsigned long long)v);
	} else {
		mbuf_printf(b, "%s %llu\n", name, (unsigned long long)v);
	}
}

void metrics_sample(struct mbuf *b, const char *name, const char *lk, const char *lv, double v)
{
	char num[64];

	if (isnan(v))
		snprintf(num, sizeof(num), "NaN");
	else if (isinf(v))
		snprintf(num, sizeof(num), "%s", v > 0 ? "+Inf" : "-Inf");
	else
		snprintf(num, sizeof(num), "%.17g", v);
	if (lk) {
		open_labels(b, name, "", lk, lv);
		mbuf_printf(b, "} %s\n", num);
	} else {
		mbuf_printf(b, "%s %s\n", name, num);
	}
}

void metrics_hist(struct mbuf *b, const char *name, const char *lk, const char *lv,
		  const struct hwfs_hist *h)
{
	uint64_t cum = 0;

	for (unsigned i = 0; i <= HWFS_HIST_BUCKETS; i++) {
		cum += hwfs_load(&h->b[i]);
		open_labels(b, name, "_bucket", lk, lv);
		if (i < HWFS_HIST_BUCKETS)
			mbuf_printf(b, "%sle=\"%g\"} %llu\n", lk ? "," : "", hwfs_hist_le[i],
				    (unsigned long long)cum);
		else
			mbuf_printf(b, "%sle=\"+Inf\"} %llu\n", lk ? "," : "",
				    (unsigned long long)cum);
	}
	if (lk) {
		open_labels(b, name, "_sum", lk, lv);
		mbuf_printf(b, "} %.9f\n", (double)hwfs_load(&h->sum_ns) / 1e9);
		open_labels(b, name, "_count", lk, lv);
		mbuf_printf(b, "} %llu\n", (unsigned long long)cum);
	} else {
		mbuf_printf(b, "%s_sum %.9f\n%s_count %llu\n", name,
			    (double)hwfs_load(&h->sum_ns) / 1e9, name, (unsigned long long)cum);
	}
}

void metrics_build_info(struct mbuf *b)
{
	metrics_family(b, "hwfs_build_info", "gauge", "hwfs build; the value is always 1");
	metrics_sample_u64(b, "hwfs_build_info", "version", HWFS_VERSION, 1);
}

/* A counter family of one sample. */
static void counter1(struct mbuf *b, const char *name, const char *help, uint64_t v)
{
	metrics_family(b, name, "counter", help);
	metrics_sample_u64(b, name, NULL, NULL, v);
}

/* A histogram family of one series without labels. */
static void hist1(struct mbuf *b, const char *name, const char *help, const struct hwfs_hist *h)
{
	metrics_family(b, name, "histogram", help);
	metrics_hist(b, name, NULL, NULL, h);
}

void metrics_node(struct mbuf *b)
{
	const struct hwfs_node_metrics *m = &hwfs_nm;

	metrics_family(b, "hwfs_commits_total", "counter",
		       "commits of this node by outcome (committed, refused by its engines or "
		       "checks, failed)");
	for (int i = 0; i < HWFS_COMMIT_N; i++)
		metrics_sample_u64(b, "hwfs_commits_total", "outcome", hwfs_commit_outcome_name[i],
				   hwfs_load(&m->commits[i]));
	metrics_family(b, "hwfs_commit_duration_seconds", "histogram",
		       "commit phases on this node: prepare (engine barrier) and flip (current)");
	metrics_hist(b, "hwfs_commit_duration_seconds", "phase", "prepare", &m->commit_prepare);
	metrics_hist(b, "hwfs_commit_duration_seconds", "phase", "flip", &m->commit_flip);
	hist1(b, "hwfs_publish_duration_seconds",
	      "hwfs publish, from the request to the sealed version", &m->publish);
	hist1(b, "hwfs_version_arrival_seconds",
	      "a replicated version, from its plan (announce) to sealed on this node", &m->arrival);
	hist1(b, "hwfs_engine_load_duration_seconds",
	      "engines: a version's \"loading\" report to its \"loaded\" report", &m->engine_load);
	hist1(b, "hwfs_engine_swap_pause_seconds",
	      "engines: the serving pause of each swap, as the engine reports it", &m->swap_pause);
	counter1(b, "hwfs_engine_refusals_total", "engines: versions an engine refused to load",
		 hwfs_load(&m->engine_refusals));
	metrics_family(b, "hwfs_fuse_requests_total", "counter", "FUSE requests by operation");
	for (int i = 0; i < HWFS_FOP_N; i++)
		metrics_sample_u64(b, "hwfs_fuse_requests_total", "op", fuse_op_name[i],
				   hwfs_load(&m->fuse[i]));
	counter1(b, "hwfs_fuse_read_bytes_total", "bytes returned by FUSE reads",
		 hwfs_load(&m->fuse_read_bytes));
}

/* metrics_coord_set_nodes()'s text, under coord_nodes_mu. */
static pthread_mutex_t coord_nodes_mu = PTHREAD_MUTEX_INITIALIZER;
static char *coord_nodes_text;

void metrics_coord_set_nodes(const char *text)
{
	char *copy = text ? strdup(text) : NULL, *old;

	pthread_mutex_lock(&coord_nodes_mu);
	old = coord_nodes_text;
	coord_nodes_text = copy;
	pthread_mutex_unlock(&coord_nodes_mu);
	free(old);
}

void metrics_coord(struct mbuf *b)
{
	const struct hwfs_coord_metrics *m = &hwfs_cm;

	metrics_family(b, "hwfs_coord_commits_total", "counter",
		       "cluster commits by outcome (committed, refused by a node, failed)");
	for (int i = 0; i < HWFS_COMMIT_N; i++)
		metrics_sample_u64(b, "hwfs_coord_commits_total", "outcome",
				   hwfs_commit_outcome_name[i], hwfs_load(&m->commits[i]));
	hist1(b, "hwfs_coord_commit_duration_seconds",
	      "cluster commits, from the request to the last ACK or the abort", &m->commit);
	hist1(b, "hwfs_coord_version_converge_seconds",
	      "a version, from its first announce to sealed on every live node", &m->converge);
	pthread_mutex_lock(&coord_nodes_mu);
	if (coord_nodes_text)
		mbuf_printf(b, "%s", coord_nodes_text);
	pthread_mutex_unlock(&coord_nodes_mu);
}
