/*
 * ns_life.c — the namespace's life cycle: ns_create() builds it from the
 * index (every version, then `current`) and frees the shards nothing
 * references; ns_destroy() frees the tree at shutdown without giving sealed
 * data back.  It sits at the top of the namespace's files: it calls the
 * versions (ns_version.c) and the core (ns.c), and nothing calls it but the
 * daemon.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "ns_i.h"

int ns_create(struct store *st, struct ns **out)
{
	struct ns *ns = calloc(1, sizeof(*ns));
	struct hwfs_vrec **recs = NULL;
	size_t n_recs = 0, dropped;
	char *cur = NULL;
	int r = -ENOMEM;

	if (!ns)
		return -ENOMEM;
	ns->st = st;
	ns->orphans.orph_next = ns->orphans.orph_prev = &ns->orphans;
	ns->next_ino = 1;
	ns->next_seq = 1;
	pthread_rwlock_init(&ns->lock, NULL);
	ns->root = ns_node_new(ns, NT_ROOT, "", S_IFDIR | 0755, 0, 0);
	ns->versions = ns_node_new(ns, NT_VERSIONS, "versions", S_IFDIR | 0755, 0, 0);
	if (!ns->root || !ns->versions || ns_kid_insert(ns->root, ns->versions) < 0)
		goto fail;
	r = store_load_versions(st, &recs, &n_recs, &cur);
	if (r < 0)
		goto fail;
	for (size_t i = 0; i < n_recs; i++) {
		r = ns_load_version(ns, recs[i]);
		if (r < 0)
			LOG_ERR("version %s could not be loaded: %s", recs[i]->name, strerror(-r));
		hwfs_vrec_free(recs[i]);
	}
	free(recs);
	recs = NULL;
	dropped = store_drop_unreferenced(st);
	if (dropped)
		LOG_INFO("freed %zu unreferenced shards", dropped);
	arena_trim(store_arena(st));
	if (cur && ns_version(ns, cur))
		ns_set_current_node(ns, cur);
	else if (cur)
		LOG_ERR("committed version %s is missing from the index", cur);
	free(cur);
	*out = ns;
	return 0;
fail:
	free(recs);
	ns_destroy(ns);
	return r;
}

/*
 * Shutdown: free the in-memory tree *without* dropping shard references —
 * dropping them would give the shards' arena ranges back (and punch them out),
 * destroying sealed data that the index still points at.  Staging of open
 * versions is given back: open versions are not persisted.
 */
static void free_subtree(struct ns *ns, struct node *n)
{
	for (size_t i = 0; i < n->nkids; i++)
		free_subtree(ns, n->kids[i]);
	n->nkids = 0;
	n->pins = 0;
	__atomic_store_n(&n->nopen, 0, __ATOMIC_RELAXED);
	writer_abort(n->w);
	node_set_writer(n, NULL);
	n->data.n_ext = 0; /* forget, do not unreference */
	ingest_result_clear(ns->st, &n->data);
	n->tfile = NULL;
	tp_file_free(n->tp); /* its pins die with the tree */
	n->tp = NULL;
	free(n->why);
	n->detached = 1;
	free(n->kids);
	free(n->target);
	free(n->name);
	if (n->type == NT_REG)
		pthread_mutex_destroy(&n->mu);
	free(n);
}

void ns_destroy(struct ns *ns)
{
	if (!ns)
		return;
	/* tensor nodes first: they pin files */
	for (size_t i = 0; i < ns->nvers; i++) {
		struct node *t = ns_child(ns->vers[i]->root, "tensors");

		if (t && t->type == NT_TDIR) {
			ns_kid_remove(ns->vers[i]->root, t);
			free_subtree(ns, t);
		}
	}
	if (ns->root)
		free_subtree(ns, ns->root);
	else if (ns->versions)
		free_subtree(ns, ns->versions);
	/* tensors first again: they pin their files */
	for (int pass = 0; pass < 2; pass++) {
		struct node *n = ns->orphans.orph_next, *next;

		for (; n != &ns->orphans; n = next) {
			next = n->orph_next;
			if (pass == 0 && n->type != NT_TENSOR)
				continue;
			n->orph_prev->orph_next = n->orph_next;
			n->orph_next->orph_prev = n->orph_prev;
			n->orph_next = n->orph_prev = NULL;
			free_subtree(ns, n);
		}
	}
	for (size_t i = 0; i < ns->nvers; i++)
		ns_version_free(ns->vers[i]);
	while (ns->graveyard) {
		struct version *v = ns->graveyard;

		ns->graveyard = v->next_dead;
		ns_version_free(v);
	}
	free(ns->vers);
	pthread_rwlock_destroy(&ns->lock);
	free(ns);
}
