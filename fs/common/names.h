/*
 * names.h — names and text that cross the layers: a hash as the JSON string
 * every side prints and parses, the checks of an engine's name and state,
 * and making a peer's or a client's text safe for a terminal.
 *
 * They live below every layer because both sides of the hooks use them: the
 * daemon (its engine registry, `hwfs status`, `hwfs diff`) and the
 * replicator (the wire protocol, the coordinator, which repeats what nodes
 * tell it to `hwfs status --cluster` and `hwfs commit`).  Nothing here keeps
 * state.
 */
#ifndef HWFS_NAMES_H
#define HWFS_NAMES_H

#include <jansson.h>

#include "hwfs_common.h"

/*
 * The longest file or version name, in bytes (NAME_MAX of the kernel): the
 * one limit the namespace, the manifest, the wire, the library and the CLI
 * check.
 */
#define HWFS_NAME_MAX 255
/* Longest engine name, and its alphabet (docs/engines.md). */
#define HWFS_ENGINE_NAME_MAX 64
/* Longest refusal reason kept from an engine's report (longer ones are cut). */
#define HWFS_ENGINE_REASON_MAX 512

/** The engine states `hwfs status` shows, in the order of enum eng_state (engine_registry.c). */
extern const char *const hwfs_engine_states[4];

/** @h as a new JSON string of 32 lowercase hex digits (what proto_hash() reads), or NULL. */
json_t *hwfs_hash_json(const hwfs_hash_t *h);

/** Is @name a valid engine name: 1-64 characters of [A-Za-z0-9._-]?  Returns 1 or 0. */
int hwfs_engine_name_valid(const char *name);
/** Is @state (NULL: no) one of hwfs_engine_states?  Returns 1 or 0. */
int hwfs_engine_state_valid(const char *state);

/**
 * hwfs_has_controls() - does @s hold a control character a terminal may
 * obey: C0, DEL, or C1 (U+0080-U+009F, 0xC2 0x80-0x9F in UTF-8)?  Returns 1
 * or 0.
 */
int hwfs_has_controls(const char *s);

/**
 * hwfs_clean_text() - @s fit for a one-line message or a terminal: at most
 * @max bytes (cut on a UTF-8 boundary), every control character (C0, DEL,
 * C1) a space.  Engine reasons in the daemon, and on the coordinator
 * everything a peer says that `hwfs commit` or `hwfs status --cluster`
 * prints.  Returns a malloc'd string, NULL without memory.  Where the
 * characters must stay readable (the log, tp/README), hwfs_escape() of
 * hwfs_common.h writes them as \xNN instead (it is in util.c, which libhwfs
 * links too).
 */
char *hwfs_clean_text(const char *s, size_t max);

/**
 * hwfs_valid_name() - may @name be a file or version name: 1..255 bytes of
 * valid UTF-8, no '/', no control character (C0, DEL, C1), not "." or ".."
 * (names end up in the manifest's JSON and on terminals)?  Returns 1 or 0.
 */
int hwfs_valid_name(const char *name);

#endif /* HWFS_NAMES_H */
