/*
 * hwfs_common.h — the vocabulary every hwfs module shares.
 *
 * Error convention (all modules): functions return 0 on success or a negative
 * errno value (-ENOENT, -EINVAL, ...) on failure; out-parameters are written
 * only on success.  Cleanup uses a single `out:` label.  Human-readable detail
 * for parse errors travels in caller-supplied (char *err, size_t errlen)
 * buffers, never through globals.
 *
 * This header also defines the content hash (XXH3-128, canonical big-endian
 * byte order, printed as 32 lowercase hex digits) and the plain-data records
 * that describe a version (hwfs_vrec -> hwfs_frec -> hwfs_extent /
 * hwfs_tensor).  These records are what the index persists, what the manifest
 * serialises and what the namespace is built from; they carry no pointers into
 * other modules' state.
 */
#ifndef HWFS_COMMON_H
#define HWFS_COMMON_H

#include <errno.h>
#include <pthread.h>
#include <sys/types.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define HWFS_HASH_LEN 16
#define HWFS_HASH_HEX 33 /* 32 hex digits + NUL */

/** A content hash: XXH3-128 of the bytes, canonical (big-endian) order. */
typedef struct {
	uint8_t b[HWFS_HASH_LEN];
} hwfs_hash_t;

/** Hash @n bytes at @p into @out (XXH3-128, canonical form). */
void hwfs_hash_buf(const void *p, size_t n, hwfs_hash_t *out);
/** Write @h as 32 lowercase hex digits plus NUL into @out. */
void hwfs_hash_hex(const hwfs_hash_t *h, char out[HWFS_HASH_HEX]);
/** Parse 32 hex digits. Returns 0 or -EINVAL. */
int hwfs_hash_parse(const char *hex, hwfs_hash_t *out);
/** memcmp-style ordering of two hashes. */
int hwfs_hash_cmp(const hwfs_hash_t *a, const hwfs_hash_t *b);
/** True when every byte of @h is zero (the "no hash" value). */
int hwfs_hash_is_zero(const hwfs_hash_t *h);

/** State of a version. Open versions live only in memory (see docs/design.md). */
enum hwfs_vstate {
	HWFS_V_OPEN = 0,    /* being written, mutable, not committable */
	HWFS_V_SEALED = 1,  /* immutable, verified at ingest, committable */
	HWFS_V_DAMAGED = 2, /* `hwfs verify` found a shard whose bytes do not match */
};
/** Name of a state as shown by `hwfs status`: "open", "sealed", "damaged". */
const char *hwfs_vstate_name(enum hwfs_vstate s);

enum hwfs_kind {
	HWFS_K_REG = 1,
	HWFS_K_DIR = 2,
	HWFS_K_LNK = 3,
};

/** A file range [off, off+len) that is exactly the whole shard @hash. */
struct hwfs_extent {
	uint64_t off;
	uint64_t len;
	hwfs_hash_t hash;
};

/** One tensor of a safetensors file. @off is the absolute offset in the file. */
struct hwfs_trec {
	char *name;
	char dtype[16];
	uint32_t ndim;
	uint64_t *shape; /* ndim entries (NULL when ndim == 0) */
	uint64_t off;
	uint64_t len;
	hwfs_hash_t hash; /* XXH3-128 of the tensor's bytes */
};

/** One entry of a version: regular file, directory or symlink. */
struct hwfs_frec {
	char *path; /* relative to the version root, '/'-separated, no leading '/' */
	enum hwfs_kind kind;
	uint32_t mode; /* permission bits only (07777) */
	uint32_t uid, gid;
	int64_t mtime_ns;
	uint64_t size;              /* regular files: logical size */
	char *target;               /* symlinks: the target; else NULL */
	size_t n_ext;               /* regular files: extents sorted by off, covering [0,size) */
	struct hwfs_extent *ext;
	size_t n_tensors;           /* safetensors files that parsed: tensors sorted by off */
	struct hwfs_trec *tensors;
	char *st_error;             /* *.safetensors that did not parse: why; else NULL */
};

/** A whole version. */
struct hwfs_vrec {
	char *name;
	enum hwfs_vstate state;
	uint64_t seq;        /* creation order on this node, 1-based */
	int64_t created_ns;  /* wall clock */
	int64_t sealed_ns;
	hwfs_hash_t digest;  /* XXH3-128 of the canonical manifest (zero while open) */
	size_t n_files;      /* sorted by path (strcmp) */
	struct hwfs_frec *files;
};

/** Where a shard lives in the arena. */
struct hwfs_shardloc {
	hwfs_hash_t hash;
	uint64_t arena_off;
	uint64_t size;
};

/** Free the contents of @f (not @f itself). */
void hwfs_frec_clear(struct hwfs_frec *f);
/** Free @v and everything it owns. NULL is a no-op. */
void hwfs_vrec_free(struct hwfs_vrec *v);

/* ---- small shared helpers (fs/common/util.c) ---- */

/**
 * Log one line to stderr (the daemon's log file): UTC timestamp with milliseconds,
 * level tag, message ("2026-11-23T13:45:01.123Z hwfs[warn]: ...").  The
 * message is cut to 1023 bytes and then escaped with hwfs_escape(), so text
 * from a file, a client or a peer (a tensor name, a partition pattern) can
 * neither reach a terminal's escapes raw nor start a line of its own: pass it
 * as it is, never escaped already.
 */
void hwfs_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LOG_ERR(...) hwfs_log("error", __VA_ARGS__)
#define LOG_WARN(...) hwfs_log("warn", __VA_ARGS__)
#define LOG_INFO(...) hwfs_log("info", __VA_ARGS__)

/**
 * Format one line into @err (@errlen bytes; nothing when @err is NULL),
 * control characters replaced by '?'.
 */
void hwfs_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/**
 * hwfs_utf8_len() - bytes of the UTF-8 sequence at @p (NUL-terminated), or 0
 * when it is not valid UTF-8 (a stray continuation byte, an overlong 2-byte
 * form, a cut sequence) or @p is at the NUL.
 */
int hwfs_utf8_len(const unsigned char *p);

/**
 * hwfs_escape() - @s as text that carries no control character: each C0
 * control (newline included), DEL, C1 control (U+0080-U+009F: both of its
 * bytes) and byte that is not part of valid UTF-8 becomes \xNN (two lowercase
 * hex digits), a backslash becomes \\, every other character is copied.  The
 * one escaping of text from files, clients and peers where hwfs prints it
 * (the log, tp/README, `hwfs manifest`).  Writes at most @len bytes, the NUL
 * included, into @buf (@len > 0), cut before an escape or character that does
 * not fit whole.  Returns the length of the whole escaped text without its NUL
 * (as snprintf does): at most 4 times strlen(@s).
 */
size_t hwfs_escape(char *buf, size_t len, const char *s);
/** hwfs_escape() of @s into a new string: malloc'd, NULL without memory. */
char *hwfs_escape_dup(const char *s);

/* How hwfs_fail() makes the reason it formats one line. */
enum hwfs_err_clean {
	HWFS_ERR_CTRL,  /* control characters (< 0x20, 0x7f) become '?', as hwfs_set_err() */
	HWFS_ERR_ASCII, /* every byte outside printable ASCII becomes '?' (JSON- and log-safe) */
	HWFS_ERR_LINES, /* line breaks (\n, \r) become spaces; every other byte is kept */
};
/**
 * hwfs_fail() - the reason of a parser's refusal: format it into @err (@errlen
 * bytes; nothing when @err is NULL or @errlen 0), cleaned as @how says, and
 * return @rc, so that `return hwfs_fail(-EINVAL, ...)` ends the failing call.
 * The private fail() of the manifest and protocol decoders are this.
 */
int hwfs_fail(int rc, char *err, size_t errlen, enum hwfs_err_clean how, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/** Parse "123", "4K", "512M", "2G", "1T" (powers of 1024). Returns 0 or -EINVAL. */
int hwfs_parse_size(const char *s, uint64_t *out);
/** Format bytes as "1.50 GiB" into @buf. Returns @buf. */
char *hwfs_fmt_size(uint64_t bytes, char *buf, size_t len);
/** Wall clock in nanoseconds. */
int64_t hwfs_now_ns(void);
/** Monotonic clock (CLOCK_MONOTONIC) in nanoseconds: the engine barrier's clock. */
uint64_t hwfs_mono_ns(void);
/** Monotonic clock in seconds. */
double hwfs_mono_s(void);
/** CPU nanoseconds the calling thread has used (CLOCK_THREAD_CPUTIME_ID). */
uint64_t hwfs_self_cpu_ns(void);
/** CPU nanoseconds thread @thread of this process has used (its CPU clock); 0 if unknown. */
uint64_t hwfs_thread_cpu_ns(pthread_t thread);
/** The same for the thread of kernel id @tid of this process (Linux); 0 if it is gone. */
uint64_t hwfs_tid_cpu_ns(pid_t tid);

#define HWFS_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define HWFS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define HWFS_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif /* HWFS_COMMON_H */
