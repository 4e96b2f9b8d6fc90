/*
 * gen_corpus.h — what the two files of gen_corpus share: writing a seed
 * under CORPUS_DIR, failing loudly, and the manifest gen_manifest() makes
 * for the messages that carry one.  See gen_corpus.c.
 */
#ifndef HWFS_GEN_CORPUS_H
#define HWFS_GEN_CORPUS_H

#include <stddef.h>

/* Print "gen_corpus: MESSAGE" and exit 1. */
void __attribute__((noreturn, format(printf, 1, 2))) fatal(const char *fmt, ...);
/* malloc() that never returns NULL (fatal instead). */
void *xmalloc(size_t n);
/* Write @n bytes at @p as CORPUS_DIR/@dir/@name. */
void put(const char *dir, const char *name, const void *p, size_t n);
/* put() of a string without its NUL. */
void put_str(const char *dir, const char *name, const char *s);

/* A real manifest, for ANNOUNCE and PLAN (set by gen_manifest(), which runs first). */
extern char *manifest_text;

/* gen_corpus_files.c: the seeds of the file parsers. */
void gen_safetensors(void);
void gen_manifest(void);
void gen_partition(void);

#endif /* HWFS_GEN_CORPUS_H */
