/*
 * names.c — names and text both sides of the replicator's hooks check or
 * print: hashes as JSON hex, engine names and states, terminal-safe text
 * (see names.h).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "names.h"

const char *const hwfs_engine_states[4] = {"idle", "loading", "loaded", "refused"};

json_t *hwfs_hash_json(const hwfs_hash_t *h)
{
	char hex[HWFS_HASH_HEX];

	hwfs_hash_hex(h, hex);
	return json_string(hex);
}

/* 1 when @name is 1-HWFS_ENGINE_NAME_MAX characters of [A-Za-z0-9._-], else 0. */
int hwfs_engine_name_valid(const char *name)
{
	size_t n = strlen(name);

	if (n < 1 || n > HWFS_ENGINE_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return 0;
	}
	return 1;
}

/* 1 when @state is one of hwfs_engine_states (what engines_json() shows), else 0. */
int hwfs_engine_state_valid(const char *state)
{
	for (size_t i = 0; state && i < HWFS_ARRAY_SIZE(hwfs_engine_states); i++)
		if (!strcmp(state, hwfs_engine_states[i]))
			return 1;
	return 0;
}

int hwfs_has_controls(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p < 0x20 || *p == 0x7f || (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F))
			return 1;
	return 0;
}

/*
 * Text from a client or a peer made fit for a one-line message or a
 * terminal (see names.h): cut to @max bytes on a UTF-8 character boundary;
 * C0 controls and DEL become a space, and so does each C1 control (U+0080 to
 * U+009F, two bytes in UTF-8), which some terminals also obey.  Returns a
 * malloc'd string, NULL without memory.
 */
char *hwfs_clean_text(const char *s, size_t max)
{
	size_t n = strlen(s), k = 0;
	char *c;

	if (n > max) {
		n = max;
		while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
			n--;
	}
	c = malloc(n + 1);
	if (!c)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		unsigned char b = (unsigned char)s[i];

		if (b == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
		    (unsigned char)s[i + 1] <= 0x9F) {
			c[k++] = ' ';
			i++;
		} else {
			c[k++] = b < 0x20 || b == 0x7f ? ' ' : (char)b;
		}
	}
	c[k] = '\0';
	return c;
}

/*
 * Names must survive the manifest (JSON) and a terminal: UTF-8 without
 * control characters (C0, DEL, and C1: U+0080-U+009F, which some terminals
 * obey), 1..255 bytes, no '/', not "." or "..".
 */
int hwfs_valid_name(const char *name)
{
	const unsigned char *p = (const unsigned char *)name;

	if (!*name || !strcmp(name, ".") || !strcmp(name, "..") || strlen(name) > HWFS_NAME_MAX)
		return 0;
	while (*p) {
		int n = hwfs_utf8_len(p);

		if (n == 0 || *p == '/' || *p < 0x20 || *p == 0x7f || (*p == 0xC2 && p[1] <= 0x9F))
			return 0;
		p += n;
	}
	return 1;
}
