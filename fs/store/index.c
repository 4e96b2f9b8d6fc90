/*
 * index.c — the persistent index of sealed versions, one sqlite database per
 * store.
 *
 * The database runs in WAL mode with synchronous=NORMAL: a commit is durable
 * once the WAL is synced at checkpoint time, and a crash can lose at most the
 * last few transactions, never tear one.  Foreign keys are on; every child
 * table (files, extents, tensors) references its parent with ON DELETE
 * CASCADE, but the module deletes children explicitly, bottom up, because one
 * set-based DELETE per table is much cheaper than a cascade trigger per row.
 *
 * Schema version 1 (meta key "schema"):
 *   meta(key, value)
 *   versions(name PK, seq, state, created_ns, sealed_ns, digest BLOB(16))
 *   files(version, path, kind, mode, uid, gid, mtime_ns, size, target,
 *         st_error)                               PK (version, path)
 *   extents(version, path, off, len, hash BLOB(16)) PK (version, path, off)
 *   tensors(version, path, name, dtype, shape, off, len, hash BLOB(16))
 *   shards(hash BLOB(16) PK, arena_off, size)
 * plus an index on extents(hash) for the shard garbage collection and one on
 * tensors(version, path, off) for loading.  Unsigned 64-bit quantities are
 * stored as their two's-complement int64 bit pattern so that every value
 * round-trips; a tensor shape is compact JSON text ("[4096,4096]", "[]").
 *
 * Writing a version is one BEGIN IMMEDIATE transaction: the old rows of that
 * name go first, then the version, its files, extents and tensors are
 * inserted with prepared statements reused across the loop, and shard rows
 * are added with INSERT OR IGNORE (a shard already in the arena keeps its
 * recorded location).  Any error rolls the whole transaction back.  Deleting a
 * version drops, in the same transaction, every shard row that no remaining
 * extent references; replacing a version does not (the caller's @locs may
 * legitimately mention shards it is about to reuse), so such rows wait for
 * the next delete.
 *
 * Loading reads one version at a time: files ordered by path (sqlite's BINARY
 * collation is memcmp order, i.e. strcmp order for strings without NUL),
 * then its extents and tensors ordered by (path, off) and merged into the
 * files in a single pass.
 *
 * Every sqlite failure is logged with sqlite's message and reported as -EIO;
 * allocation failures are -ENOMEM.  The caller serialises access, so the
 * connection is opened with SQLITE_OPEN_NOMUTEX.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>

#include "index.h"

#define INDEX_SCHEMA "1"

struct index {
	sqlite3 *db;
};

static const char schema_sql[] =
	"CREATE TABLE IF NOT EXISTS meta("
	" key TEXT PRIMARY KEY NOT NULL,"
	" value TEXT NOT NULL);"
	"CREATE TABLE IF NOT EXISTS versions("
	" name TEXT PRIMARY KEY NOT NULL,"
	" seq INTEGER NOT NULL,"
	" state INTEGER NOT NULL,"
	" created_ns INTEGER NOT NULL,"
	" sealed_ns INTEGER NOT NULL,"
	" digest BLOB NOT NULL);"
	"CREATE TABLE IF NOT EXISTS files("
	" version TEXT NOT NULL REFERENCES versions(name) ON DELETE CASCADE,"
	" path TEXT NOT NULL,"
	" kind INTEGER NOT NULL,"
	" mode INTEGER NOT NULL,"
	" uid INTEGER NOT NULL,"
	" gid INTEGER NOT NULL,"
	" mtime_ns INTEGER NOT NULL,"
	" size INTEGER NOT NULL,"
	" target TEXT,"
	" st_error TEXT,"
	" PRIMARY KEY(version, path));"
	"CREATE TABLE IF NOT EXISTS extents("
	" version TEXT NOT NULL,"
	" path TEXT NOT NULL,"
	" off INTEGER NOT NULL,"
	" len INTEGER NOT NULL,"
	" hash BLOB NOT NULL,"
	" PRIMARY KEY(version, path, off),"
	" FOREIGN KEY(version, path) REFERENCES files(version, path) ON DELETE CASCADE);"
	"CREATE INDEX IF NOT EXISTS extents_hash ON extents(hash);"
	"CREATE TABLE IF NOT EXISTS tensors("
	" version TEXT NOT NULL,"
	" path TEXT NOT NULL,"
	" name TEXT NOT NULL,"
	" dtype TEXT NOT NULL,"
	" shape TEXT NOT NULL,"
	" off INTEGER NOT NULL,"
	" len INTEGER NOT NULL,"
	" hash BLOB NOT NULL,"
	" FOREIGN KEY(version, path) REFERENCES files(version, path) ON DELETE CASCADE);"
	"CREATE INDEX IF NOT EXISTS tensors_vpo ON tensors(version, path, off);"
	"CREATE TABLE IF NOT EXISTS shards("
	" hash BLOB PRIMARY KEY NOT NULL,"
	" arena_off INTEGER NOT NULL,"
	" size INTEGER NOT NULL);"
	"INSERT OR IGNORE INTO meta(key, value) VALUES('schema', '" INDEX_SCHEMA "');";

/* Log sqlite's last message for @what and return -EIO. */
static int sqerr(sqlite3 *db, const char *what)
{
	LOG_ERR("index: %s: %s", what, db ? sqlite3_errmsg(db) : "out of memory");
	return -EIO;
}

static int exec(sqlite3 *db, const char *sql)
{
	char *msg = NULL;

	if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
		LOG_ERR("index: %s: %s", sql, msg ? msg : sqlite3_errmsg(db));
		sqlite3_free(msg);
		return -EIO;
	}
	return 0;
}

static int prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st)
{
	if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) {
		*st = NULL;
		return sqerr(db, sql);
	}
	return 0;
}

/* Step a statement that returns no rows, then reset it for reuse. */
static int step_done(sqlite3 *db, sqlite3_stmt *st, const char *what)
{
	int rc = sqlite3_step(st);

	sqlite3_reset(st);
	if (rc != SQLITE_DONE)
		return sqerr(db, what);
	return 0;
}

static void rollback(sqlite3 *db)
{
	/* Fails harmlessly when sqlite already rolled back on its own. */
	sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

static int bind_hash(sqlite3_stmt *st, int i, const hwfs_hash_t *h)
{
	return sqlite3_bind_blob(st, i, h->b, HWFS_HASH_LEN, SQLITE_TRANSIENT);
}

static int col_hash(sqlite3_stmt *st, int i, hwfs_hash_t *h)
{
	const void *p = sqlite3_column_blob(st, i);

	if (sqlite3_column_bytes(st, i) != HWFS_HASH_LEN || !p) {
		LOG_ERR("index: column %s holds a %d-byte hash", sqlite3_column_name(st, i),
			sqlite3_column_bytes(st, i));
		return -EIO;
	}
	memcpy(h->b, p, HWFS_HASH_LEN);
	return 0;
}

/* A copy of a nullable text column; *out is NULL for SQL NULL. */
static int col_strdup(sqlite3_stmt *st, int i, char **out)
{
	const unsigned char *s;

	*out = NULL;
	if (sqlite3_column_type(st, i) == SQLITE_NULL)
		return 0;
	s = sqlite3_column_text(st, i);
	if (!s)
		return -ENOMEM;
	*out = strdup((const char *)s);
	return *out ? 0 : -ENOMEM;
}

static int bind_text_or_null(sqlite3_stmt *st, int i, const char *s)
{
	return s ? sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC) : sqlite3_bind_null(st, i);
}

/* ---- shape <-> "[a,b,c]" ---- */

static char *shape_to_json(const struct hwfs_trec *t)
{
	size_t cap = 3 + (size_t)t->ndim * 21, n = 0;
	char *s = malloc(cap);

	if (!s)
		return NULL;
	s[n++] = '[';
	for (uint32_t i = 0; i < t->ndim; i++)
		n += (size_t)snprintf(s + n, cap - n, "%s%" PRIu64, i ? "," : "", t->shape[i]);
	s[n++] = ']';
	s[n] = '\0';
	return s;
}

/* Parse "[]" or "[1,2,3]" of decimal uint64 values. */
static int shape_from_json(const char *s, struct hwfs_trec *t)
{
	uint32_t nd = 0;
	uint64_t *shape = NULL;
	const char *p;
	int rc = -EIO;

	if (!s || s[0] != '[')
		goto out;
	if (strcmp(s, "[]") == 0) {
		rc = 0;
		goto out;
	}
	nd = 1;
	for (p = s; *p; p++)
		if (*p == ',')
			nd++;
	shape = calloc(nd, sizeof(*shape));
	if (!shape) {
		rc = -ENOMEM;
		goto out;
	}
	p = s + 1;
	for (uint32_t i = 0; i < nd; i++) {
		uint64_t v = 0;

		if (*p < '0' || *p > '9')
			goto out;
		while (*p >= '0' && *p <= '9') {
			unsigned d = (unsigned)(*p++ - '0');

			if (v > (UINT64_MAX - d) / 10)
				goto out;
			v = v * 10 + d;
		}
		shape[i] = v;
		if (*p != (i + 1 == nd ? ']' : ','))
			goto out;
		p++;
	}
	if (*p)
		goto out;
	rc = 0;
out:
	if (rc == 0) {
		t->ndim = nd;
		t->shape = shape;
	} else {
		free(shape);
		if (rc == -EIO)
			LOG_ERR("index: malformed tensor shape '%s'", s ? s : "(null)");
	}
	return rc;
}

/* ---- open / close ---- */

int index_open(const char *path, struct index **out)
{
	struct index *ix = NULL;
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	const char *mode;
	int rc;

	if (sqlite3_open_v2(path, &db,
			    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
			    NULL) != SQLITE_OK) {
		LOG_ERR("index: open %s: %s", path, db ? sqlite3_errmsg(db) : "out of memory");
		rc = -EIO;
		goto out;
	}
	sqlite3_extended_result_codes(db, 1);
	sqlite3_busy_timeout(db, 5000);

	/* journal_mode answers with the mode it ended up in. */
	rc = prepare(db, "PRAGMA journal_mode=WAL", &st);
	if (rc)
		goto out;
	if (sqlite3_step(st) != SQLITE_ROW) {
		rc = sqerr(db, "PRAGMA journal_mode=WAL");
		goto out;
	}
	mode = (const char *)sqlite3_column_text(st, 0);
	if (!mode || sqlite3_stricmp(mode, "wal") != 0)
		LOG_WARN("index: %s: journal mode is %s, not wal", path, mode ? mode : "?");
	sqlite3_finalize(st);
	st = NULL;

	rc = exec(db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;");
	if (rc)
		goto out;
	rc = exec(db, "BEGIN IMMEDIATE");
	if (rc)
		goto out;
	rc = exec(db, schema_sql);
	if (rc) {
		rollback(db);
		goto out;
	}
	rc = exec(db, "COMMIT");
	if (rc) {
		rollback(db);
		goto out;
	}

	rc = prepare(db, "SELECT value FROM meta WHERE key = 'schema'", &st);
	if (rc)
		goto out;
	if (sqlite3_step(st) != SQLITE_ROW) {
		rc = sqerr(db, "read schema version");
		goto out;
	}
	if (sqlite3_column_type(st, 0) != SQLITE_TEXT ||
	    strcmp((const char *)sqlite3_column_text(st, 0), INDEX_SCHEMA) != 0) {
		LOG_ERR("index: %s: schema version %s is not supported (want " INDEX_SCHEMA ")",
			path, sqlite3_column_type(st, 0) == SQLITE_TEXT
				      ? (const char *)sqlite3_column_text(st, 0)
				      : "?");
		rc = -EIO;
		goto out;
	}

	ix = calloc(1, sizeof(*ix));
	if (!ix) {
		rc = -ENOMEM;
		goto out;
	}
	ix->db = db;
	db = NULL;
	*out = ix;
	rc = 0;
out:
	sqlite3_finalize(st);
	sqlite3_close(db);
	return rc;
}

void index_close(struct index *ix)
{
	if (!ix)
		return;
	if (sqlite3_close(ix->db) != SQLITE_OK)
		LOG_ERR("index: close: %s", sqlite3_errmsg(ix->db));
	free(ix);
}

/* ---- meta ---- */

int index_meta_get(struct index *ix, const char *key, char **val)
{
	sqlite3_stmt *st = NULL;
	char *v;
	int rc, s;

	rc = prepare(ix->db, "SELECT value FROM meta WHERE key = ?1", &st);
	if (rc)
		goto out;
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	s = sqlite3_step(st);
	if (s == SQLITE_DONE) {
		rc = -ENOENT;
		goto out;
	}
	if (s != SQLITE_ROW) {
		rc = sqerr(ix->db, "meta get");
		goto out;
	}
	rc = col_strdup(st, 0, &v);
	if (rc)
		goto out;
	if (!v) {
		rc = -ENOENT;
		goto out;
	}
	*val = v;
out:
	sqlite3_finalize(st);
	return rc;
}

int index_meta_set(struct index *ix, const char *key, const char *val)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = prepare(ix->db,
		     val ? "INSERT INTO meta(key, value) VALUES(?1, ?2)"
			   " ON CONFLICT(key) DO UPDATE SET value = excluded.value"
			 : "DELETE FROM meta WHERE key = ?1",
		     &st);
	if (rc)
		goto out;
	sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
	if (val)
		sqlite3_bind_text(st, 2, val, -1, SQLITE_STATIC);
	rc = step_done(ix->db, st, "meta set");
out:
	sqlite3_finalize(st);
	return rc;
}

/* ---- writing versions ---- */

/* Delete every row of version @name (not the shards). Inside a transaction. */
static int delete_rows(sqlite3 *db, const char *name, int *existed)
{
	static const char *const sql[] = {
		"DELETE FROM tensors WHERE version = ?1",
		"DELETE FROM extents WHERE version = ?1",
		"DELETE FROM files WHERE version = ?1",
		"DELETE FROM versions WHERE name = ?1",
	};
	sqlite3_stmt *st = NULL;
	int rc = 0;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(sql); i++) {
		rc = prepare(db, sql[i], &st);
		if (rc)
			goto out;
		sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
		rc = step_done(db, st, sql[i]);
		if (rc)
			goto out;
		sqlite3_finalize(st);
		st = NULL;
	}
	if (existed)
		*existed = sqlite3_changes(db) > 0;
out:
	sqlite3_finalize(st);
	return rc;
}

/* index_put_version()'s statements, prepared once per version. */
struct put_stmts {
	sqlite3_stmt *version, *file, *extent, *tensor, *shard;
};

/* Prepare @ps's statements.  Returns 0 or -errno (those prepared are finalized by put_finalize()). */
static int put_prepare(sqlite3 *db, struct put_stmts *ps)
{
	int rc;

	if ((rc = prepare(db,
			  "INSERT INTO versions(name, seq, state, created_ns, sealed_ns, digest)"
			  " VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
			  &ps->version)) ||
	    (rc = prepare(db,
			  "INSERT INTO files(version, path, kind, mode, uid, gid, mtime_ns, size,"
			  " target, st_error) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
			  &ps->file)) ||
	    (rc = prepare(db,
			  "INSERT INTO extents(version, path, off, len, hash)"
			  " VALUES(?1, ?2, ?3, ?4, ?5)",
			  &ps->extent)) ||
	    (rc = prepare(db,
			  "INSERT INTO tensors(version, path, name, dtype, shape, off, len, hash)"
			  " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
			  &ps->tensor)) ||
	    (rc = prepare(db,
			  "INSERT OR IGNORE INTO shards(hash, arena_off, size) VALUES(?1, ?2, ?3)",
			  &ps->shard)))
		return rc;
	return 0;
}

/* Finalize @ps's statements (those never prepared are NULL: a no-op). */
static void put_finalize(struct put_stmts *ps)
{
	sqlite3_finalize(ps->version);
	sqlite3_finalize(ps->file);
	sqlite3_finalize(ps->extent);
	sqlite3_finalize(ps->tensor);
	sqlite3_finalize(ps->shard);
}

/* The row of version @v.  Returns 0 or -errno. */
static int put_version_row(sqlite3 *db, sqlite3_stmt *sv, const struct hwfs_vrec *v)
{
	sqlite3_bind_text(sv, 1, v->name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(sv, 2, (sqlite3_int64)v->seq);
	sqlite3_bind_int(sv, 3, (int)v->state);
	sqlite3_bind_int64(sv, 4, v->created_ns);
	sqlite3_bind_int64(sv, 5, v->sealed_ns);
	bind_hash(sv, 6, &v->digest);
	return step_done(db, sv, "insert version");
}

/*
 * The rows of file @f (the @i-th of version @vname, which @ps's file,
 * extent and tensor statements have bound already): the file, its extents,
 * its tensors.  Returns 0 or -errno.
 */
static int put_file(sqlite3 *db, struct put_stmts *ps, const char *vname, size_t i,
		    const struct hwfs_frec *f)
{
	sqlite3_stmt *sf = ps->file, *se = ps->extent, *stn = ps->tensor;
	int rc;

	if (!f->path) {
		LOG_ERR("index: version %s: file %zu has no path", vname, i);
		return -EINVAL;
	}
	sqlite3_bind_text(sf, 2, f->path, -1, SQLITE_STATIC);
	sqlite3_bind_int(sf, 3, (int)f->kind);
	sqlite3_bind_int64(sf, 4, f->mode);
	sqlite3_bind_int64(sf, 5, f->uid);
	sqlite3_bind_int64(sf, 6, f->gid);
	sqlite3_bind_int64(sf, 7, f->mtime_ns);
	sqlite3_bind_int64(sf, 8, (sqlite3_int64)f->size);
	bind_text_or_null(sf, 9, f->target);
	bind_text_or_null(sf, 10, f->st_error);
	rc = step_done(db, sf, "insert file");
	if (rc)
		return rc;

	sqlite3_bind_text(se, 2, f->path, -1, SQLITE_STATIC);
	for (size_t j = 0; j < f->n_ext; j++) {
		const struct hwfs_extent *e = &f->ext[j];

		sqlite3_bind_int64(se, 3, (sqlite3_int64)e->off);
		sqlite3_bind_int64(se, 4, (sqlite3_int64)e->len);
		bind_hash(se, 5, &e->hash);
		rc = step_done(db, se, "insert extent");
		if (rc)
			return rc;
	}

	sqlite3_bind_text(stn, 2, f->path, -1, SQLITE_STATIC);
	for (size_t j = 0; j < f->n_tensors; j++) {
		const struct hwfs_trec *t = &f->tensors[j];
		char *shape = shape_to_json(t);

		if (!shape)
			return -ENOMEM;
		sqlite3_bind_text(stn, 3, t->name ? t->name : "", -1, SQLITE_STATIC);
		sqlite3_bind_text(stn, 4, t->dtype, (int)strnlen(t->dtype, sizeof(t->dtype)),
				  SQLITE_STATIC);
		sqlite3_bind_text(stn, 5, shape, -1, SQLITE_TRANSIENT);
		sqlite3_bind_int64(stn, 6, (sqlite3_int64)t->off);
		sqlite3_bind_int64(stn, 7, (sqlite3_int64)t->len);
		bind_hash(stn, 8, &t->hash);
		free(shape); /* bound as a copy */
		rc = step_done(db, stn, "insert tensor");
		if (rc)
			return rc;
	}
	return 0;
}

int index_put_version(struct index *ix, const struct hwfs_vrec *v,
		      const struct hwfs_shardloc *locs, size_t n_locs)
{
	sqlite3 *db = ix->db;
	struct put_stmts ps = {0};
	int in_tx = 0, rc;

	if (!v || !v->name) {
		rc = -EINVAL;
		goto out;
	}
	rc = exec(db, "BEGIN IMMEDIATE");
	if (rc)
		goto out;
	in_tx = 1;
	rc = delete_rows(db, v->name, NULL);
	if (rc)
		goto out;
	rc = put_prepare(db, &ps);
	if (rc)
		goto out;
	rc = put_version_row(db, ps.version, v);
	if (rc)
		goto out;

	/* The version name is bound once; only the other parameters change. */
	sqlite3_bind_text(ps.file, 1, v->name, -1, SQLITE_STATIC);
	sqlite3_bind_text(ps.extent, 1, v->name, -1, SQLITE_STATIC);
	sqlite3_bind_text(ps.tensor, 1, v->name, -1, SQLITE_STATIC);
	for (size_t i = 0; i < v->n_files; i++) {
		rc = put_file(db, &ps, v->name, i, &v->files[i]);
		if (rc)
			goto out;
	}

	for (size_t i = 0; i < n_locs; i++) {
		bind_hash(ps.shard, 1, &locs[i].hash);
		sqlite3_bind_int64(ps.shard, 2, (sqlite3_int64)locs[i].arena_off);
		sqlite3_bind_int64(ps.shard, 3, (sqlite3_int64)locs[i].size);
		rc = step_done(db, ps.shard, "insert shard");
		if (rc)
			goto out;
	}

	rc = exec(db, "COMMIT");
	if (rc)
		goto out;
	in_tx = 0;
out:
	put_finalize(&ps);
	if (in_tx)
		rollback(db);
	return rc;
}

int index_set_state(struct index *ix, const char *name, enum hwfs_vstate stv)
{
	sqlite3_stmt *st = NULL;
	int rc;

	rc = prepare(ix->db, "UPDATE versions SET state = ?2 WHERE name = ?1", &st);
	if (rc)
		goto out;
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 2, (int)stv);
	rc = step_done(ix->db, st, "set state");
	if (rc)
		goto out;
	if (sqlite3_changes(ix->db) == 0)
		rc = -ENOENT;
out:
	sqlite3_finalize(st);
	return rc;
}

int index_delete_version(struct index *ix, const char *name)
{
	sqlite3 *db = ix->db;
	int in_tx = 0, existed = 0, rc;

	rc = exec(db, "BEGIN IMMEDIATE");
	if (rc)
		goto out;
	in_tx = 1;
	rc = delete_rows(db, name, &existed);
	if (rc)
		goto out;
	if (!existed) {
		rc = -ENOENT;
		goto out;
	}
	rc = exec(db, "DELETE FROM shards WHERE NOT EXISTS"
		      " (SELECT 1 FROM extents e WHERE e.hash = shards.hash)");
	if (rc)
		goto out;
	rc = exec(db, "COMMIT");
	if (rc)
		goto out;
	in_tx = 0;
out:
	if (in_tx)
		rollback(db);
	return rc;
}

/* ---- loading ---- */

/* Make room for one more element in *@arr (of @n, capacity *@cap). */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
	size_t nc;
	void *p;

	if (n < *cap)
		return 0;
	nc = n < 8 ? 8 : n * 2;
	p = reallocarray(*arr, nc, elem);
	if (!p)
		return -ENOMEM;
	memset((char *)p + n * elem, 0, (nc - n) * elem);
	*arr = p;
	*cap = nc;
	return 0;
}

/* Where a loader is in the version it fills (see load_rows). */
struct cursor {
	size_t fi;              /* position in v->files (sorted by path) */
	struct hwfs_frec *cur;  /* the file whose rows arrive now */
	size_t cap;             /* capacity of the array being filled */
};

/*
 * Point @c at the file named @path, the owner of the row at hand.  Rows of
 * extents/tensors arrive sorted by (path, off) like v->files, so the cursor
 * only moves forward; a new file starts a new array (capacity 0).  Returns 0
 * or -EIO (a row for a file the version does not have).
 */
static int cursor_file(struct hwfs_vrec *v, struct cursor *c, const char *path)
{
	if (c->cur && strcmp(c->cur->path, path) == 0)
		return 0;
	while (c->fi < v->n_files && strcmp(v->files[c->fi].path, path) < 0)
		c->fi++;
	if (c->fi < v->n_files && strcmp(v->files[c->fi].path, path) == 0) {
		c->cur = &v->files[c->fi];
		c->cap = 0;
		return 0;
	}
	LOG_ERR("index: version %s: row for unknown file %s", v->name, path);
	return -EIO;
}

/* One row of a loader's SELECT into @v; returns 0 or -errno. */
typedef int (*row_fn)(sqlite3 *db, sqlite3_stmt *st, struct hwfs_vrec *v, struct cursor *c);

/*
 * Run @sql (its ?1 bound to @v's name) and hand every row to @row with one
 * cursor; @what names the query in the log when sqlite fails.  The three
 * loaders of a version (files, extents, tensors) are this loop and a row
 * function each.  Returns 0 or -errno.
 */
static int load_rows(sqlite3 *db, struct hwfs_vrec *v, const char *sql, const char *what,
		     row_fn row)
{
	sqlite3_stmt *st = NULL;
	struct cursor c = {0};
	int rc, s;

	rc = prepare(db, sql, &st);
	if (rc)
		goto out;
	sqlite3_bind_text(st, 1, v->name, -1, SQLITE_STATIC);
	while ((s = sqlite3_step(st)) == SQLITE_ROW) {
		rc = row(db, st, v, &c);
		if (rc)
			goto out;
	}
	if (s != SQLITE_DONE)
		rc = sqerr(db, what);
out:
	sqlite3_finalize(st);
	return rc;
}

/* A row of files: path, kind, mode, uid, gid, mtime_ns, size, target, st_error. */
static int file_row(sqlite3 *db, sqlite3_stmt *st, struct hwfs_vrec *v, struct cursor *c)
{
	struct hwfs_frec *f;
	int rc;

	rc = grow((void **)&v->files, &c->cap, v->n_files, sizeof(*v->files));
	if (rc)
		return rc;
	f = &v->files[v->n_files++];
	if ((rc = col_strdup(st, 0, &f->path)) || (rc = col_strdup(st, 7, &f->target)) ||
	    (rc = col_strdup(st, 8, &f->st_error)))
		return rc;
	if (!f->path)
		return sqerr(db, "file without path");
	f->kind = (enum hwfs_kind)sqlite3_column_int(st, 1);
	f->mode = (uint32_t)sqlite3_column_int64(st, 2);
	f->uid = (uint32_t)sqlite3_column_int64(st, 3);
	f->gid = (uint32_t)sqlite3_column_int64(st, 4);
	f->mtime_ns = sqlite3_column_int64(st, 5);
	f->size = (uint64_t)sqlite3_column_int64(st, 6);
	return 0;
}

/* A row of extents: path, off, len, hash. */
static int extent_row(sqlite3 *db, sqlite3_stmt *st, struct hwfs_vrec *v, struct cursor *c)
{
	const char *path = (const char *)sqlite3_column_text(st, 0);
	struct hwfs_frec *cur;
	struct hwfs_extent *e;
	int rc;

	if (!path)
		return sqerr(db, "extent without path");
	if ((rc = cursor_file(v, c, path)))
		return rc;
	cur = c->cur;
	rc = grow((void **)&cur->ext, &c->cap, cur->n_ext, sizeof(*cur->ext));
	if (rc)
		return rc;
	e = &cur->ext[cur->n_ext];
	e->off = (uint64_t)sqlite3_column_int64(st, 1);
	e->len = (uint64_t)sqlite3_column_int64(st, 2);
	rc = col_hash(st, 3, &e->hash);
	if (rc)
		return rc;
	cur->n_ext++;
	return 0;
}

/* A row of tensors: path, name, dtype, shape, off, len, hash. */
static int tensor_row(sqlite3 *db, sqlite3_stmt *st, struct hwfs_vrec *v, struct cursor *c)
{
	const char *path = (const char *)sqlite3_column_text(st, 0);
	const char *dtype = (const char *)sqlite3_column_text(st, 2);
	struct hwfs_frec *cur;
	struct hwfs_trec *t;
	int rc;

	if (!path || !dtype)
		return sqerr(db, "tensor without path or dtype");
	if ((rc = cursor_file(v, c, path)))
		return rc;
	cur = c->cur;
	rc = grow((void **)&cur->tensors, &c->cap, cur->n_tensors, sizeof(*cur->tensors));
	if (rc)
		return rc;
	/* Count it now so that a failure below frees what was filled in. */
	t = &cur->tensors[cur->n_tensors++];
	if (strlen(dtype) >= sizeof(t->dtype)) {
		LOG_ERR("index: version %s: %s: dtype '%s' too long", v->name, path, dtype);
		return -EIO;
	}
	strcpy(t->dtype, dtype);
	if ((rc = col_strdup(st, 1, &t->name)))
		return rc;
	if (!t->name)
		return sqerr(db, "tensor without name");
	rc = shape_from_json((const char *)sqlite3_column_text(st, 3), t);
	if (rc)
		return rc;
	t->off = (uint64_t)sqlite3_column_int64(st, 4);
	t->len = (uint64_t)sqlite3_column_int64(st, 5);
	return col_hash(st, 6, &t->hash);
}

/* The files of @v, then their extents and tensors, merged in by path. */
static int load_version_rows(sqlite3 *db, struct hwfs_vrec *v)
{
	int rc;

	rc = load_rows(db, v,
		       "SELECT path, kind, mode, uid, gid, mtime_ns, size, target, st_error"
		       " FROM files WHERE version = ?1 ORDER BY path",
		       "load files", file_row);
	if (!rc)
		rc = load_rows(db, v,
			       "SELECT path, off, len, hash FROM extents WHERE version = ?1"
			       " ORDER BY path, off",
			       "load extents", extent_row);
	if (!rc)
		rc = load_rows(db, v,
			       "SELECT path, name, dtype, shape, off, len, hash FROM tensors"
			       " WHERE version = ?1 ORDER BY path, off, rowid",
			       "load tensors", tensor_row);
	return rc;
}

int index_load(struct index *ix, struct hwfs_vrec ***vs, size_t *n)
{
	sqlite3 *db = ix->db;
	sqlite3_stmt *st = NULL;
	struct hwfs_vrec **arr = NULL;
	size_t cnt = 0, cap = 0;
	int in_tx = 0, rc, s;

	/* One read transaction, so the snapshot is consistent. */
	rc = exec(db, "BEGIN");
	if (rc)
		goto out;
	in_tx = 1;
	rc = prepare(db,
		     "SELECT name, seq, state, created_ns, sealed_ns, digest FROM versions"
		     " ORDER BY seq, name",
		     &st);
	if (rc)
		goto out;
	while ((s = sqlite3_step(st)) == SQLITE_ROW) {
		struct hwfs_vrec *v;

		rc = grow((void **)&arr, &cap, cnt, sizeof(*arr));
		if (rc)
			goto out;
		v = calloc(1, sizeof(*v));
		if (!v) {
			rc = -ENOMEM;
			goto out;
		}
		arr[cnt++] = v;
		if ((rc = col_strdup(st, 0, &v->name)))
			goto out;
		if (!v->name) {
			rc = sqerr(db, "version without name");
			goto out;
		}
		v->seq = (uint64_t)sqlite3_column_int64(st, 1);
		v->state = (enum hwfs_vstate)sqlite3_column_int(st, 2);
		v->created_ns = sqlite3_column_int64(st, 3);
		v->sealed_ns = sqlite3_column_int64(st, 4);
		if ((rc = col_hash(st, 5, &v->digest)))
			goto out;
		if ((rc = load_version_rows(db, v)))
			goto out;
	}
	if (s != SQLITE_DONE) {
		rc = sqerr(db, "load versions");
		goto out;
	}
	sqlite3_finalize(st);
	st = NULL;
	rc = exec(db, "COMMIT");
	if (rc)
		goto out;
	in_tx = 0;
	*vs = arr;
	*n = cnt;
	arr = NULL;
	cnt = 0;
out:
	sqlite3_finalize(st);
	if (in_tx)
		rollback(db);
	for (size_t i = 0; i < cnt; i++)
		hwfs_vrec_free(arr[i]);
	free(arr);
	return rc;
}

int index_load_shards(struct index *ix, struct hwfs_shardloc **locs, size_t *n)
{
	sqlite3_stmt *st = NULL;
	struct hwfs_shardloc *arr = NULL;
	size_t cnt = 0, cap = 0;
	int rc, s;

	rc = prepare(ix->db, "SELECT hash, arena_off, size FROM shards ORDER BY hash", &st);
	if (rc)
		goto out;
	while ((s = sqlite3_step(st)) == SQLITE_ROW) {
		rc = grow((void **)&arr, &cap, cnt, sizeof(*arr));
		if (rc)
			goto out;
		rc = col_hash(st, 0, &arr[cnt].hash);
		if (rc)
			goto out;
		arr[cnt].arena_off = (uint64_t)sqlite3_column_int64(st, 1);
		arr[cnt].size = (uint64_t)sqlite3_column_int64(st, 2);
		cnt++;
	}
	if (s != SQLITE_DONE) {
		rc = sqerr(ix->db, "load shards");
		goto out;
	}
	*locs = arr;
	*n = cnt;
	arr = NULL;
out:
	sqlite3_finalize(st);
	free(arr);
	return rc;
}
