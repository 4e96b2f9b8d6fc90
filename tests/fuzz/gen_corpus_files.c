/*
 * gen_corpus_files.c — the generated seeds of the file parsers' fuzz targets
 * (safetensors/, manifest/, partition/; what each holds: gen_corpus.c's
 * header), each checked against the parser it feeds.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "delta.h"
#include "manifest.h"
#include "proto.h"
#include "safetensors.h"
#include "gen_corpus.h"

char *manifest_text; /* gen_corpus.h */

/* ------------------------------------------------------------ safetensors */

/*
 * Write safetensors seed @name: the 8-byte length (@hlen, or the JSON's
 * length plus @pad when @hlen is 0), the JSON, @pad spaces, @data_len bytes
 * of data.  @parses: what st_parse() with the file's size must say (0 or
 * -EINVAL).
 */
static void st_seed(const char *name, int parses, uint64_t hlen, const char *json, size_t pad,
		    size_t data_len)
{
	size_t jl = strlen(json), n = 8 + jl + pad + data_len;
	uint8_t *b = xmalloc(n);
	struct st_header *h = NULL;
	char err[256] = "";
	int rc;

	if (!hlen)
		hlen = jl + pad;
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(hlen >> (8 * i));
	memcpy(b + 8, json, jl);
	memset(b + 8 + jl, ' ', pad);
	for (size_t i = 0; i < data_len; i++)
		b[8 + jl + pad + i] = (uint8_t)(i * 7 + 3);
	rc = st_parse(b, n, n, &h, err, sizeof(err));
	if (rc != parses)
		fatal("safetensors seed %s: st_parse gives %d (%s), not %d", name, rc, err, parses);
	st_free(h);
	put("safetensors", name, b, n);
	free(b);
}

/*
 * The safetensors seeds.  Long by design: a flat list, one seed per call;
 * splitting it would only spread the list.
 */
void gen_safetensors(void)
{
	static const char *const dtypes[][2] = {
		{"BOOL", "1"}, {"U8", "1"},      {"I8", "1"},      {"F8_E5M2", "1"}, {"F8_E4M3", "1"},
		{"F8_E8M0", "1"}, {"I16", "2"},  {"U16", "2"},     {"F16", "2"},     {"BF16", "2"},
		{"I32", "4"},  {"U32", "4"},     {"F32", "4"},     {"F64", "8"},     {"I64", "8"},
		{"U64", "8"},  {"C64", "8"},
	};
	const char *llama =
	    "{\"__metadata__\":{\"format\":\"pt\"},"
	    "\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[16,8],\"data_offsets\":[0,256]},"
	    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"BF16\",\"shape\":[8,8],"
	    "\"data_offsets\":[256,384]},"
	    "\"model.layers.0.input_layernorm.weight\":{\"dtype\":\"F32\",\"shape\":[8],"
	    "\"data_offsets\":[384,416]},"
	    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[416,448]}}";
	char json[8192], *p;
	uint64_t off = 0;

	st_seed("valid_llama", 0, 0, llama, 0, 448);
	st_seed("valid_llama_padded", 0, 0, llama, 6, 448);
	st_seed("valid_one_f32", 0, 0,
		"{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 0, 24);
	st_seed("valid_empty_object", 0, 0, "{}", 6, 0);
	st_seed("valid_metadata_only", 0, 0, "{\"__metadata__\":{\"a\":\"b\",\"c\":\"\"}}", 0, 0);
	st_seed("valid_scalar_and_empty", 0, 0,
		"{\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
		"\"e\":{\"dtype\":\"F16\",\"shape\":[0,4],\"data_offsets\":[8,8]},"
		"\"e2\":{\"dtype\":\"BF16\",\"shape\":[4,0],\"data_offsets\":[8,8]},"
		"\"t\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[8,11]}}",
		0, 11);
	st_seed("valid_subbyte", 0, 0,
		"{\"f4\":{\"dtype\":\"F4\",\"shape\":[6],\"data_offsets\":[0,3]},"
		"\"f6\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[3,6]},"
		"\"f6b\":{\"dtype\":\"F6_E3M2\",\"shape\":[2,4],\"data_offsets\":[6,12]}}",
		0, 12);
	st_seed("valid_unordered_keys_extra_fields", 0, 0,
		"{\"b\":{\"shape\":[2],\"data_offsets\":[2,4],\"dtype\":\"U8\",\"extra\":[1]},"
		"\"a\":{\"data_offsets\":[0,2],\"dtype\":\"U8\",\"shape\":[2]}}",
		0, 4);
	p = json + sprintf(json, "{");
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(dtypes); i++) {
		unsigned sz = (unsigned)atoi(dtypes[i][1]);

		p += sprintf(p, "%s\"t_%s\":{\"dtype\":\"%s\",\"shape\":[3,%zu],"
			     "\"data_offsets\":[%llu,%llu]}", i ? "," : "", dtypes[i][0],
			     dtypes[i][0], i + 1, (unsigned long long)off,
			     (unsigned long long)(off + 3 * (i + 1) * sz));
		off += 3 * (i + 1) * sz;
	}
	strcpy(p, "}");
	st_seed("valid_every_dtype", 0, 0, json, 0, (size_t)off);
	/* many small tensors: long chunker walks */
	p = json + sprintf(json, "{");
	off = 0;
	for (int i = 0; i < 48; i++) {
		unsigned len = 4 * (unsigned)(1 + (i * 37) % 29);

		p += sprintf(p, "%s\"layers.%d.w\":{\"dtype\":\"F32\",\"shape\":[%u],"
			     "\"data_offsets\":[%llu,%llu]}", i ? "," : "", i, len / 4,
			     (unsigned long long)off, (unsigned long long)(off + len));
		off += len;
	}
	strcpy(p, "}");
	st_seed("valid_48_tensors", 0, 0, json, 3, (size_t)off);

	/* the size check */
	st_seed("data_truncated", -EINVAL, 0, llama, 0, 300);
	st_seed("data_missing", -EINVAL, 0, llama, 0, 0);
	st_seed("data_trailing_bytes", -EINVAL, 0, llama, 0, 460);
	/* the length field */
	st_seed("hlen_zero", -EINVAL, 0x0, "", 0, 0);
	{
		static const uint8_t zero[8] = {0};
		static const uint8_t short5[5] = {0x10, 0, 0, 0, 0};
		static const uint8_t only_len[8] = {0x10, 0, 0, 0, 0, 0, 0, 0};
		static const uint8_t nine[9] = {0x01, 0, 0, 0, 0, 0, 0, 0, '{'};

		put("safetensors", "hlen_zero_8_bytes", zero, sizeof(zero));
		put("safetensors", "short_5_bytes", short5, sizeof(short5));
		put("safetensors", "only_length", only_len, sizeof(only_len));
		put("safetensors", "hlen_1_brace", nine, sizeof(nine));
		put("safetensors", "empty_file", "", 0);
	}
	st_seed("hlen_huge", -EINVAL, UINT64_MAX, "{}", 0, 0);
	st_seed("hlen_2_63", -EINVAL, 1ull << 63, "{}", 0, 0);
	st_seed("hlen_over_limit", -EINVAL, ST_MAX_HEADER + 1ull, "{}", 0, 0);
	st_seed("hlen_at_limit_truncated", -EINVAL, ST_MAX_HEADER, "{}", 0, 0);
	st_seed("hlen_past_end", -EINVAL, 4096, llama, 0, 448);
	st_seed("hlen_short_cuts_json", -EINVAL, 40, llama, 0, 448);
	/* the JSON */
	st_seed("json_not_object", -EINVAL, 0, "[1,2]", 0, 0);
	st_seed("json_unterminated", -EINVAL, 0, "{\"a\":{\"dtype\":\"F32\"", 0, 0);
	st_seed("json_trailing_garbage", -EINVAL, 0, "{} xx", 0, 0);
	st_seed("json_invalid_utf8", -EINVAL, 0,
		"{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("json_nul_in_name", -EINVAL, 0,
		"{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("json_duplicate_tensor", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		"\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		0, 2);
	st_seed("json_control_chars_in_name", -EINVAL, 0,
		"{\"evil\\nname\\u001b[31m\":{\"dtype\":\"XX\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		0, 1);
	/* the layout */
	st_seed("offsets_overlap", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
		0, 24);
	st_seed("offsets_same_start", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
		0, 8);
	st_seed("offsets_gap", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
		0, 20);
	st_seed("offsets_not_from_0", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12);
	st_seed("offsets_reversed", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 0, 8);
	st_seed("offsets_size_mismatch", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 0, 12);
	st_seed("offsets_three", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 0, 2);
	st_seed("offsets_negative", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 0, 0);
	st_seed("offsets_huge", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
		"\"data_offsets\":[9223372036854775806,9223372036854775807]}}",
		0, 0);
	/* dtypes and shapes */
	st_seed("dtype_unknown", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 0, 16);
	st_seed("dtype_lowercase", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_number", -EINVAL, 0,
		"{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_with_nul", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32\\u0000X\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("dtype_long", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F32F32F32F32F32F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0,
		4);
	st_seed("dtype_missing", -EINVAL, 0, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 0, 4);
	st_seed("subbyte_odd_count", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 0, 2);
	st_seed("shape_negative", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_float", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_not_array", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 0, 1);
	st_seed("shape_overflow", -EINVAL, 0,
		"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,16],"
		"\"data_offsets\":[0,0]}}",
		0, 0);
	p = json + sprintf(json, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
	for (int i = 0; i < 33; i++)
		p += sprintf(p, "%s1", i ? "," : "");
	strcpy(p, "],\"data_offsets\":[0,1]}}");
	st_seed("shape_33_dims", -EINVAL, 0, json, 0, 1);
	st_seed("tensor_not_object", -EINVAL, 0, "{\"a\":[0,1]}", 0, 0);
	st_seed("metadata_not_strings", -EINVAL, 0, "{\"__metadata__\":{\"a\":1}}", 0, 0);
	st_seed("metadata_not_object", -EINVAL, 0, "{\"__metadata__\":\"pt\"}", 0, 0);
}

/* --------------------------------------------------------------- manifest */

static struct hwfs_frec file_rec(const char *path, enum hwfs_kind kind, uint32_t mode)
{
	return (struct hwfs_frec){.path = (char *)path, .kind = kind, .mode = mode,
				  .mtime_ns = 1700000000123456789ll};
}

static hwfs_hash_t hash_of(const char *tag)
{
	hwfs_hash_t h;

	hwfs_hash_buf(tag, strlen(tag), &h);
	return h;
}

/* Write @v as manifest_build() encodes it (and that it parses). */
static char *manifest_seed(const char *name, const struct hwfs_vrec *v)
{
	struct hwfs_vrec *back = NULL;
	char *j, err[256];
	size_t n;

	if (manifest_build(v, &j, &n))
		fatal("manifest_build(%s)", name);
	if (manifest_parse(j, n, &back, err, sizeof(err)))
		fatal("manifest seed %s does not parse: %s", name, err);
	hwfs_vrec_free(back);
	put("manifest", name, j, n);
	return j;
}

/* Write @text as manifest seed @name, which manifest_parse() must refuse. */
static void manifest_bad(const char *name, const char *text)
{
	struct hwfs_vrec *v = NULL;
	char err[256];

	if (!manifest_parse(text, strlen(text), &v, err, sizeof(err)))
		fatal("manifest seed %s parses", name);
	put_str("manifest", name, text);
}

/* @text with its first @from replaced by @to (malloc'd); @from must occur. */
static char *edit(const char *text, const char *from, const char *to)
{
	const char *at = strstr(text, from);
	char *out;

	if (!at)
		fatal("edit: \"%s\" not found", from);
	if (asprintf(&out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from)) < 0)
		fatal("out of memory");
	return out;
}

/*
 * The manifest seeds.  Long by design: a flat list, one seed per call or
 * edit of a valid manifest; splitting it would only spread the list.
 */
void gen_manifest(void)
{
	uint64_t shape_e[2] = {16, 8}, shape_q[2] = {8, 8}, shape_n[1] = {8}, shape_z[2] = {0, 4};
	struct hwfs_trec tensors[] = {
		{.name = "model.embed_tokens.weight", .dtype = "BF16", .ndim = 2, .shape = shape_e,
		 .off = 256, .len = 256},
		{.name = "model.empty", .dtype = "F16", .ndim = 2, .shape = shape_z, .off = 512,
		 .len = 0},
		{.name = "model.layers.0.self_attn.q_proj.weight", .dtype = "BF16", .ndim = 2,
		 .shape = shape_q, .off = 512, .len = 128},
		{.name = "model.norm.weight", .dtype = "F32", .ndim = 1, .shape = shape_n,
		 .off = 640, .len = 32},
		{.name = "scale", .dtype = "F32", .ndim = 0, .shape = NULL, .off = 672, .len = 4},
	};
	struct hwfs_extent ext_st[3], ext_cfg[1], ext_copy[1], ext_big[2], ext_part[1];
	struct hwfs_frec files[10];
	struct hwfs_vrec v = {.name = "v1", .state = HWFS_V_SEALED};
	char *simple, *full, *s, *t;
	size_t nf = 0;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(tensors); i++)
		tensors[i].hash = hash_of(tensors[i].name);
	ext_st[0] = (struct hwfs_extent){0, 256, hash_of("st-header")};
	ext_st[1] = (struct hwfs_extent){256, 256, hash_of("st-embed")};
	ext_st[2] = (struct hwfs_extent){512, 164, hash_of("st-rest")};
	ext_cfg[0] = (struct hwfs_extent){0, 120, hash_of("config")};
	ext_copy[0] = ext_cfg[0]; /* the same shard in two files */
	ext_big[0] = (struct hwfs_extent){0, 1ull << 30, hash_of("big-0")};
	ext_big[1] = (struct hwfs_extent){1ull << 30, 12345, hash_of("big-1")};
	ext_part[0] = (struct hwfs_extent){0, 64, hash_of("partition")};

	/* simple: a directory, a file, a symlink, an empty file */
	files[nf] = file_rec("a", HWFS_K_DIR, 0755), nf++;
	files[nf] = file_rec("a/b.bin", HWFS_K_REG, 0644);
	files[nf].size = 120, files[nf].n_ext = 1, files[nf].ext = ext_cfg, nf++;
	files[nf] = file_rec("empty", HWFS_K_REG, 0600), nf++;
	files[nf] = file_rec("link", HWFS_K_LNK, 0777);
	files[nf].target = "a/b.bin", nf++;
	v.n_files = nf;
	v.files = files;
	simple = manifest_seed("simple", &v);

	/* full: the same, a safetensors file with its tensors, a failed one,
	 * a shard shared by two files, a large file, a partition file */
	files[nf] = file_rec("config.json", HWFS_K_REG, 0644);
	files[nf].size = 120, files[nf].n_ext = 1, files[nf].ext = ext_copy, nf++;
	files[nf] = file_rec("model.safetensors", HWFS_K_REG, 0444);
	files[nf].size = 676, files[nf].n_ext = 3, files[nf].ext = ext_st;
	files[nf].n_tensors = HWFS_ARRAY_SIZE(tensors), files[nf].tensors = tensors, nf++;
	files[nf] = file_rec("broken.safetensors", HWFS_K_REG, 0644);
	files[nf].size = 64, files[nf].n_ext = 1, files[nf].ext = ext_part;
	files[nf].st_error = "header length 0", nf++;
	files[nf] = file_rec("hwfs-partition.json", HWFS_K_REG, 0644);
	files[nf].size = 64, files[nf].n_ext = 1, files[nf].ext = ext_part, nf++;
	files[nf] = file_rec("sub/dir/big.bin", HWFS_K_REG, 04755);
	files[nf].mtime_ns = -5;
	files[nf].size = (1ull << 30) + 12345, files[nf].n_ext = 2, files[nf].ext = ext_big, nf++;
	files[nf] = file_rec("sub", HWFS_K_DIR, 0700), nf++;
	v.n_files = nf;
	v.name = "run-7.step-001200";
	full = manifest_seed("full", &v);

	v.n_files = 0;
	v.name = "empty-version";
	free(manifest_seed("empty_version", &v));
	files[0] = file_rec("mod\xc3\xa8le/\xe6\xa8\xa9\xe9\x87\x8d.bin", HWFS_K_REG, 0644);
	files[0].size = 120, files[0].n_ext = 1, files[0].ext = ext_cfg;
	files[1] = file_rec("mod\xc3\xa8le", HWFS_K_DIR, 0755);
	v.n_files = 2;
	v.name = "v-\xc3\xbcn\xc3\xaf";
	free(manifest_seed("unicode", &v));
	manifest_text = strdup(simple);

	/* accepted, not canonical: spacing, key order */
	{
		json_error_t je;
		json_t *js = json_loads(full, 0, &je);
		char *pretty = js ? json_dumps(js, JSON_INDENT(2)) : NULL;
		struct hwfs_vrec *back = NULL;
		char err[256];

		if (!pretty || manifest_parse(pretty, strlen(pretty), &back, err, sizeof(err)))
			fatal("an indented manifest does not parse");
		hwfs_vrec_free(back);
		put_str("manifest", "full_indented", pretty);
		free(pretty);
		json_decref(js);
	}

	/* refused */
#define BAD(nm, from, to)                                                                          \
	do {                                                                                       \
		t = edit(simple, from, to);                                                        \
		manifest_bad(nm, t);                                                               \
		free(t);                                                                           \
	} while (0)
	BAD("bad_format_tag", "hwfs-manifest/1", "hwfs-manifest/2");
	BAD("bad_version_dotdot", "\"version\":\"v1\"", "\"version\":\"..\"");
	BAD("bad_version_slash", "\"version\":\"v1\"", "\"version\":\"a/b\"");
	BAD("bad_version_empty", "\"version\":\"v1\"", "\"version\":\"\"");
	BAD("bad_path_dotdot", "\"path\":\"a/b.bin\"", "\"path\":\"a/../b.bin\"");
	BAD("bad_path_absolute", "\"path\":\"empty\"", "\"path\":\"/empty\"");
	BAD("bad_path_empty_component", "\"path\":\"a/b.bin\"", "\"path\":\"a//b.bin\"");
	BAD("bad_path_dot", "\"path\":\"a/b.bin\"", "\"path\":\"a/./b.bin\"");
	BAD("bad_path_control_char", "\"path\":\"empty\"", "\"path\":\"em\\u0001pty\"");
	BAD("bad_path_nul", "\"path\":\"empty\"", "\"path\":\"em\\u0000pty\"");
	BAD("bad_files_unsorted", "\"path\":\"empty\"", "\"path\":\"0\"");
	BAD("bad_files_duplicate", "\"path\":\"empty\"", "\"path\":\"a/b.bin\"");
	BAD("bad_below_a_file", "\"path\":\"empty\"", "\"path\":\"a/b.bin/c\"");
	BAD("bad_below_a_symlink", "\"target\":\"a/b.bin\"}",
	    "\"target\":\"a/b.bin\"},{\"kind\":\"dir\",\"mode\":493,\"mtime_ns\":1,"
	    "\"path\":\"link/x\"}");
	BAD("bad_mode_too_big", "\"mode\":420", "\"mode\":4096000");
	BAD("bad_mode_negative", "\"mode\":420", "\"mode\":-1");
	BAD("bad_unknown_key", "\"kind\":\"dir\"", "\"kind\":\"dir\",\"uid\":0");
	BAD("bad_unknown_root_key", "\"format\"", "\"seq\":1,\"format\"");
	BAD("bad_kind", "\"kind\":\"dir\"", "\"kind\":\"fifo\"");
	BAD("bad_symlink_no_target", ",\"target\":\"a/b.bin\"", "");
	BAD("bad_file_no_size", ",\"size\":120", "");
	BAD("bad_size_more_than_extents", "\"size\":120", "\"size\":121");
	BAD("bad_size_huge", "\"size\":120", "\"size\":18446744073709551615");
	BAD("bad_extent_zero_length", "[0,120,", "[0,0,");
	BAD("bad_extent_not_from_0", "[0,120,", "[1,120,");
	BAD("bad_shard_size", ",120]]", ",121]]");
	BAD("bad_shards_not_array", "\"shards\":[", "\"shards\":{\"x\":[");
	BAD("bad_duplicate_key", "\"version\":\"v1\"", "\"version\":\"v1\",\"version\":\"v1\"");
	BAD("bad_trailing_garbage", "\"version\":\"v1\"}", "\"version\":\"v1\"} {}");
	BAD("bad_truncated", "\"version\":\"v1\"}", "\"version\":\"v");
#undef BAD
	t = strdup(simple); /* the shard's hash, and only there, in upper case */
	for (char *h = strstr(t, "\"shards\":[[\"") + 11, *e = h + 32; h < e; h++)
		if (*h >= 'a' && *h <= 'f')
			*h = (char)(*h - 'a' + 'A');
	manifest_bad("bad_hash_upper", t);
	free(t);
	t = edit(simple, "\"shards\":[", "\"shards\":[[\"00000000000000000000000000000000\",1],");
	manifest_bad("bad_shard_unused", t);
	free(t);
	s = edit(full, "\"length\":128,", "\"length\":256,");
	manifest_bad("bad_tensors_overlap", s);
	free(s);
	s = edit(full, "\"offset\":672", "\"offset\":673");
	manifest_bad("bad_tensor_outside_file", s);
	free(s);
	s = edit(full, "\"dtype\":\"F32\"", "\"dtype\":\"F32F32F32F32F32F32\"");
	manifest_bad("bad_tensor_dtype_long", s);
	free(s);
	s = edit(full, "\"shape\":[8]", "\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
					  "1,1,1,1,1,1,1,1,1,8]");
	manifest_bad("bad_tensor_33_dims", s);
	free(s);
	s = edit(full, "\"shape\":[8]", "\"shape\":[-8]");
	manifest_bad("bad_tensor_shape_negative", s);
	free(s);
	manifest_bad("bad_not_object", "[\"hwfs-manifest/1\"]");
	manifest_bad("bad_empty", "");
	manifest_bad("bad_null", "null");
	{
		char name[300];

		memset(name, 'n', 256);
		name[256] = '\0';
		t = xmalloc(strlen(simple) + 300);
		sprintf(t, "%.*s%s%s", (int)(strstr(simple, "\"v1\"") - simple + 1), simple, name,
			strstr(simple, "\"v1\"") + 3);
		manifest_bad("bad_version_256_bytes", t);
		free(t);
	}
	free(simple);
	free(full);
}

/* -------------------------------------------------------------- partition */

void gen_partition(void)
{
	static const struct {
		const char *name, *text;
	} seeds[] = {
		{"empty_object", "{}"},
		{"docs_example",
		 "{\"*.qkv_proj.weight\": 0, \"*.shared_expert_gate.weight\": \"replicate\"}\n"},
		{"all_dim0", "{\"*\": 0}"},
		{"all_dim1", "{\"*.weight\": 1}"},
		{"all_replicate", "{\"*\": \"replicate\"}"},
		{"experts_split", "{\"*.experts.*\": 0, \"*w2*\": 1}"},
		{"expert_rule_no_expert", "{\"*.scale\": \"expert\"}"},
		{"expert_rule_experts", "{\"*experts.[0-9]*\": \"expert\", \"*\": \"replicate\"}"},
		{"first_match_wins", "{\"*q_proj*\": 1, \"*proj*\": 0, \"*\": \"replicate\"}"},
		{"char_classes",
		 "{\"model.layers.[0-9].*.weight\": 1, \"model.[!l]*\": 0, \"*\": \"replicate\"}"},
		{"conv_3d_dim1", "{\"*conv*\": 1, \"*odd*\": \"replicate\"}"},
		{"packed_subbyte_dim0", "{\"*packed*\": 0}"},
		{"scalar_dim0", "{\"*.scale\": 0}"},
		{"odd_dim0", "{\"*odd*\": 0}"},
		{"fnmatch_odd_patterns",
		 "{\"[\": 0, \"\\\\\": 1, \"[!a-\": 0, \"**\": \"replicate\", \"[]]\": 1, \"*[\": 0}"},
		{"duplicate_keys", "{\"*\": 0, \"*\": \"replicate\"}"},
		{"rule_minus_zero", "{\"*q_proj*\": -0}"},
		{"unicode_pattern", "{\"*\xc3\xbc*\": 1, \"*\\u00e9*\": 0}"},
		{"whitespace", "\n\t {\r\n  \"lm_head.*\" :\t0 ,\n  \"*norm*\": \"replicate\"\n}\n\n"},
		{"nul_then_garbage", "{\"*\": 0}\0 garbage after the NUL"},
		{"expert_uppercase", "{\"*\": \"Expert\"}"},
		{"rule_2", "{\"*\": 2}"},
		{"rule_float", "{\"*\": 1.0}"},
		{"rule_true", "{\"*\": true}"},
		{"rule_null", "{\"*\": null}"},
		{"rule_object", "{\"*\": {\"dim\": 0}}"},
		{"rule_array", "{\"*\": [0]}"},
		{"pattern_newline", "{\"a\\nb\": 7}"},
		{"late_bad_rule", "{\"*q_proj*\": 0, \"*\": \"shard\"}"},
		{"not_object_array", "[{\"*\": 0}]"},
		{"not_object_string", "\"*\""},
		{"not_object_number", "0"},
		{"empty_file", ""},
		{"truncated", "{\"*q_proj*\": 0, \"*o_pr"},
		{"invalid_utf8", "{\"\xff*\": 0}"},
		{"bom", "\xef\xbb\xbf{}"},
		{"trailing_garbage", "{} {}"},
	};
	char *big, *p;

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(seeds); i++) {
		size_t n = strlen(seeds[i].text);

		if (!strcmp(seeds[i].name, "nul_then_garbage"))
			n = 9 + strlen(seeds[i].text + 9);
		put("partition", seeds[i].name, seeds[i].text, n);
	}
	/* many patterns, none matching but the last */
	big = xmalloc(64 * 1024);
	p = big + sprintf(big, "{");
	for (int i = 0; i < 1000; i++)
		p += sprintf(p, "\"nothing.%d.*\": %d, ", i, i & 1);
	strcpy(p, "\"*\": \"replicate\"}");
	put_str("partition", "many_patterns", big);
	free(big);
}

