/*
 * tunables.c — the table behind tunables.h, generated from its one list
 * HWFS_TUNABLES: a row per tunable (name, offset of its field, default,
 * range, help).  Adding a tunable is a row in tunables.h; the defaults,
 * parsing, environment lookup and the --help listing all follow from it, and
 * nothing here changes.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tunables.h"

struct row {
	const char *name;
	size_t field; /* offsetof into struct hwfs_tunables */
	uint64_t def, min, max;
	const char *help;
};

/* One row per entry of HWFS_TUNABLES (tunables.h), in its order. */
#define HWFS_TUNABLE_ROW(n, d, lo, hi, h) {#n, offsetof(struct hwfs_tunables, n), d, lo, hi, h},
static const struct row rows[] = {HWFS_TUNABLES(HWFS_TUNABLE_ROW)};
#undef HWFS_TUNABLE_ROW

static uint64_t *field(struct hwfs_tunables *t, const struct row *r)
{
	return (uint64_t *)((char *)t + r->field);
}

struct hwfs_tunables hwfs_tun;

/* Every tunable at its default, before main() (unit tests read them too). */
__attribute__((constructor)) static void set_defaults(void)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++)
		*field(&hwfs_tun, &rows[i]) = rows[i].def;
}

static int set_row(const struct row *r, const char *val)
{
	uint64_t v;

	if (hwfs_parse_size(val, &v) < 0 || v < r->min || v > r->max)
		return -EINVAL;
	*field(&hwfs_tun, r) = v;
	return 0;
}

int hwfs_tunables_set(const char *opt)
{
	const char *eq = strchr(opt, '=');

	if (!eq)
		return -ENOENT;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++)
		if (strlen(rows[i].name) == (size_t)(eq - opt) &&
		    !strncmp(rows[i].name, opt, (size_t)(eq - opt)))
			return set_row(&rows[i], eq + 1);
	return -ENOENT;
}

int hwfs_tunables_load(const char *const *opts, size_t n_opts)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++) {
		char env[64];
		const char *v;
		size_t j;

		snprintf(env, sizeof(env), "HWFS_%s", rows[i].name);
		for (j = 5; env[j]; j++)
			env[j] = (char)toupper((unsigned char)env[j]);
		v = secure_getenv(env);
		if (v && set_row(&rows[i], v) < 0) {
			LOG_ERR("bad value for %s: %s", env, v);
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < n_opts; i++) {
		int r = hwfs_tunables_set(opts[i]);

		if (r < 0)
			return r;
	}
	return 0;
}

int hwfs_tunable_known(const char *name)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++)
		if (!strcmp(rows[i].name, name))
			return 1;
	return 0;
}

void hwfs_tunables_print(FILE *f)
{
	fprintf(f, "Tunables (-o NAME=VALUE, or environment HWFS_NAME):\n");
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++) {
		fprintf(f, "  %-20s default %-12llu %s\n", rows[i].name,
			(unsigned long long)rows[i].def, rows[i].help);
	}
}
