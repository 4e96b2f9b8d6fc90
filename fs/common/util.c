/*
 * util.c — the small things every module needs: the content hash (XXH3-128
 * in canonical byte order), freeing version records, logging, escaping text
 * for the log and the terminal (hwfs_escape), sizes, clocks (wall, monotonic,
 * and threads' CPU).  Nothing here
 * keeps state.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "hwfs_common.h"

void hwfs_hash_buf(const void *p, size_t n, hwfs_hash_t *out)
{
	XXH128_hash_t h = XXH3_128bits(p, n);
	XXH128_canonical_t c;

	XXH128_canonicalFromHash(&c, h);
	memcpy(out->b, c.digest, HWFS_HASH_LEN);
}

void hwfs_hash_hex(const hwfs_hash_t *h, char out[HWFS_HASH_HEX])
{
	static const char dig[] = "0123456789abcdef";

	for (int i = 0; i < HWFS_HASH_LEN; i++) {
		out[2 * i] = dig[h->b[i] >> 4];
		out[2 * i + 1] = dig[h->b[i] & 15];
	}
	out[2 * HWFS_HASH_LEN] = '\0';
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int hwfs_hash_parse(const char *hex, hwfs_hash_t *out)
{
	hwfs_hash_t h;

	if (!hex || strlen(hex) != 2 * HWFS_HASH_LEN)
		return -EINVAL;
	for (int i = 0; i < HWFS_HASH_LEN; i++) {
		int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -EINVAL;
		h.b[i] = (uint8_t)(hi << 4 | lo);
	}
	*out = h;
	return 0;
}

int hwfs_hash_cmp(const hwfs_hash_t *a, const hwfs_hash_t *b)
{
	return memcmp(a->b, b->b, HWFS_HASH_LEN);
}

int hwfs_hash_is_zero(const hwfs_hash_t *h)
{
	for (int i = 0; i < HWFS_HASH_LEN; i++)
		if (h->b[i])
			return 0;
	return 1;
}

const char *hwfs_vstate_name(enum hwfs_vstate s)
{
	switch (s) {
	case HWFS_V_OPEN:
		return "open";
	case HWFS_V_SEALED:
		return "sealed";
	case HWFS_V_DAMAGED:
		return "damaged";
	}
	return "unknown";
}

void hwfs_frec_clear(struct hwfs_frec *f)
{
	free(f->path);
	free(f->target);
	free(f->ext);
	for (size_t i = 0; i < f->n_tensors; i++) {
		free(f->tensors[i].name);
		free(f->tensors[i].shape);
	}
	free(f->tensors);
	free(f->st_error);
	memset(f, 0, sizeof(*f));
}

void hwfs_vrec_free(struct hwfs_vrec *v)
{
	if (!v)
		return;
	for (size_t i = 0; i < v->n_files; i++)
		hwfs_frec_clear(&v->files[i]);
	free(v->files);
	free(v->name);
	free(v);
}

int hwfs_utf8_len(const unsigned char *p)
{
	int n = p[0] < 0x80 ? 1 : (p[0] & 0xE0) == 0xC0 ? 2 : (p[0] & 0xF0) == 0xE0 ? 3
		: (p[0] & 0xF8) == 0xF0 ? 4 : 0;

	if (!p[0] || (n == 2 && p[0] < 0xC2))
		return 0; /* the end, or overlong */
	for (int i = 1; i < n; i++)
		if ((p[i] & 0xC0) != 0x80)
			return 0;
	return n;
}

/*
 * Escape @s into @buf (see hwfs_common.h): \xNN for C0, DEL, C1 and bytes of
 * invalid UTF-8, \\ for a backslash.  Everything is counted, only what fits
 * whole is written.  Returns the escaped length.
 */
size_t hwfs_escape(char *buf, size_t len, const char *s)
{
	static const char dig[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)s;
	size_t k = 0, full = 0;

	while (*p) {
		int n = hwfs_utf8_len(p);
		char tmp[8]; /* one character: at most two bytes escaped (C1) */
		size_t t = 0;

		if (n == 0 || *p < 0x20 || *p == 0x7f || (n == 2 && p[0] == 0xC2 && p[1] <= 0x9F)) {
			n = n ? n : 1; /* a C1 control: both bytes; a bad byte: itself */
			for (int i = 0; i < n; i++) {
				tmp[t++] = '\\';
				tmp[t++] = 'x';
				tmp[t++] = dig[p[i] >> 4];
				tmp[t++] = dig[p[i] & 15];
			}
		} else if (*p == '\\') {
			tmp[t++] = '\\';
			tmp[t++] = '\\';
		} else {
			memcpy(tmp, p, (size_t)n);
			t = (size_t)n;
		}
		if (len && k == full && k + t < len) {
			memcpy(buf + k, tmp, t);
			k += t;
		}
		full += t;
		p += n;
	}
	if (len)
		buf[k] = '\0';
	return full;
}

char *hwfs_escape_dup(const char *s)
{
	size_t n = hwfs_escape(NULL, 0, s);
	char *e = malloc(n + 1);

	if (e)
		hwfs_escape(e, n + 1, s);
	return e;
}

void hwfs_log(const char *level, const char *fmt, ...)
{
	va_list ap;
	char buf[1024], out[4 * sizeof(buf)];
	char when[40];
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	hwfs_escape(out, sizeof(out), buf);
	fprintf(stderr, "%s.%03ldZ hwfs[%s]: %s\n", when, ts.tv_nsec / 1000000, level, out);
}

/*
 * Format one line into @err (nothing when @err is NULL or @errlen 0), control
 * characters (below 0x20, and DEL) replaced by '?', so a reason built from
 * untrusted bytes can be logged or put in a JSON string as it is.
 */
/* Format into @err (@errlen bytes, both non-zero) and clean it as @how says. */
static void vset_err(char *err, size_t errlen, enum hwfs_err_clean how, const char *fmt,
		     va_list ap)
{
	vsnprintf(err, errlen, fmt, ap);
	for (unsigned char *p = (unsigned char *)err; *p; p++) {
		switch (how) {
		case HWFS_ERR_CTRL:
			if (*p < 0x20 || *p == 0x7f)
				*p = '?';
			break;
		case HWFS_ERR_ASCII:
			if (*p < 0x20 || *p >= 0x7f)
				*p = '?';
			break;
		case HWFS_ERR_LINES:
			if (*p == '\n' || *p == '\r')
				*p = ' ';
			break;
		}
	}
}

void hwfs_set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vset_err(err, errlen, HWFS_ERR_CTRL, fmt, ap);
	va_end(ap);
}

int hwfs_fail(int rc, char *err, size_t errlen, enum hwfs_err_clean how, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return rc;
	va_start(ap, fmt);
	vset_err(err, errlen, how, fmt, ap);
	va_end(ap);
	return rc;
}

int hwfs_parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -EINVAL;
	switch (toupper((unsigned char)*end)) {
	case '\0':
		break;
	case 'K':
		mul = 1ull << 10;
		break;
	case 'M':
		mul = 1ull << 20;
		break;
	case 'G':
		mul = 1ull << 30;
		break;
	case 'T':
		mul = 1ull << 40;
		break;
	default:
		return -EINVAL;
	}
	if (*end) {
		end++;
		if (*end == 'i' || *end == 'I')
			end++;
		if (*end == 'B' || *end == 'b')
			end++;
		if (*end)
			return -EINVAL;
	}
	if (v > UINT64_MAX / mul)
		return -EINVAL;
	*out = v * mul;
	return 0;
}

char *hwfs_fmt_size(uint64_t bytes, char *buf, size_t len)
{
	static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024 && u + 1 < HWFS_ARRAY_SIZE(unit)) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%.2f %s", v, unit[u]);
	return buf;
}

int64_t hwfs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

uint64_t hwfs_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double hwfs_mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A clock's reading in nanoseconds; 0 when the clock cannot be read. */
static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t hwfs_self_cpu_ns(void)
{
	return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

uint64_t hwfs_thread_cpu_ns(pthread_t thread)
{
	clockid_t id;

	if (pthread_getcpuclockid(thread, &id) != 0)
		return 0;
	return clock_ns(id);
}

/*
 * The per-thread CPU clock of a kernel thread id is encoded as glibc's
 * pthread_getcpuclockid() encodes it (Linux's MAKE_THREAD_CPUCLOCK(tid,
 * CPUCLOCK_SCHED)): ~tid shifted left 3, ORed with 4 (per thread) | 2 (sched).
 */
uint64_t hwfs_tid_cpu_ns(pid_t tid)
{
	/* in unsigned arithmetic: ~tid is negative, and shifting a negative int is undefined */
	return clock_ns((clockid_t)((~(unsigned int)tid << 3) | 6u));
}
