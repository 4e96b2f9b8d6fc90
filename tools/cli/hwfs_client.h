/*
 * hwfs_client.h — what the client verbs of `hwfs` share: hwfs.c (the verbs,
 * the channel to the mount's daemon, the common options) and hwfs_status.c
 * (`hwfs status`).  Both are in build/hwfs and build/hwfs-core (hwfs_cli.h
 * says which file goes where); nothing else includes this.
 *
 * The channel is one libhwfs handle on the mount of -m (or $HWFS_MOUNT, else
 * /hotweights), opened on the first request.  Every answer is a JSON object;
 * a failure to ask dies with one line (die()).
 */
#ifndef HWFS_CLIENT_H
#define HWFS_CLIENT_H

#include <jansson.h>
#include <stdint.h>

/* The options cli_opts() read (each 0 or 1). */
extern int cli_json;    /* --json: print the daemon's JSON */
extern int cli_cluster; /* status --cluster */
extern int cli_watch;   /* status --cluster --watch */

/**
 * cli_opts() - the common options of client verbs (-m, --json, --help, and
 * the flags of the verbs that take them; --keep N into *@keep, refused when
 * @keep is NULL); dies with @usage unless @min_args to @max_args operands
 * follow.  --help prints @usage and exits 0.  Returns the index of the first
 * operand.
 */
int cli_opts(int argc, char **argv, const char *usage, int min_args, int max_args, int *keep);

/**
 * cli_call() - send @req (stolen) to the mount's daemon and return its final
 * answer (a progress bar on a terminal meanwhile); dies when the daemon
 * cannot be asked and, with @die_on_error, when it answers {"ok": false}.
 */
json_t *cli_call(json_t *req, int die_on_error);

/** Print @res (without its "ok") as indented JSON on stdout. */
void cli_print_json(json_t *res);

/** Integer member @k of @o (0 when it is none). */
int64_t cli_jint(json_t *o, const char *k);

/** String member @k of @o ("-" when it is none). */
const char *cli_jstr(json_t *o, const char *k);

/**
 * cli_shown() - @s as it may be printed (control characters blanked:
 * hwfs_clean_text()).  Valid until the fourth call after this one; "?"
 * without memory.
 */
const char *cli_shown(const char *s);

/** String member @k of @o as it may be printed: cli_shown(cli_jstr()). */
const char *cli_jshown(json_t *o, const char *k);

/* hwfs_status.c */

/** The versions table of `hwfs status` and `hwfs ls` from the daemon's "versions". */
void cli_print_versions(json_t *vers);

/** `hwfs status`: takes the verb's own argv, returns the exit status. */
int cmd_status(int argc, char **argv);

#endif /* HWFS_CLIENT_H */
