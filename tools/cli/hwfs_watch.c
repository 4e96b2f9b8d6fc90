/*
 * hwfs_watch.c — `hwfs watch`: follow a node's versions, run hooks, and
 * optionally answer the commit barrier as an engine (docs/engines.md, the
 * first of the four ways; docs/cli.md, "watch").
 *
 *   hwfs watch [-m MOUNT] [--engine NAME] [--on-arrive CMD] [--on-commit CMD]
 *              [--hook-timeout SECONDS] [--any-name]
 *
 * Every event is printed on stdout, one per line ("arrived v2", "current v2",
 * "prepare v2", "removed v1"), and so is every report an engine sends
 * ("loaded v2", "refused v2: REASON", "swapped v2 (pause N us)").  A hook is
 * `/bin/sh -c CMD` with HWFS_VERSION, HWFS_PATH (MOUNT/versions/V),
 * HWFS_MOUNT and HWFS_EVENT in its environment; its stdout is ours, its
 * stderr is passed through to ours and its last line is kept as the reason
 * of a refusal.  Each hook runs in a process group of its own: it is done
 * when its shell exits (a background child it leaves, still holding its
 * stderr, does not hold the watch up); one that runs longer than
 * --hook-timeout (default HOOK_TIMEOUT_DEFAULT_S) gets SIGTERM, its whole
 * group, then SIGKILL after HOOK_KILL_GRACE_MS, and counts as failed.
 *
 * Hooks only ever see version names made of A-Z a-z 0-9 . _ + @ = - that do
 * not start with '-' (hook_safe_name): a shell line that pastes $HWFS_VERSION
 * or $HWFS_PATH into JSON, a URL or a command line cannot be turned into
 * something else by a version's name.  Another name is refused without
 * running a hook ("version name not safe for hooks"), unless --any-name.
 *
 * As an engine (--engine NAME): a version that arrives, or that a commit
 * prepares before it arrived here or after it was refused, runs --on-arrive:
 * exit 0 reports it loaded, anything else refused ("on-arrive hook exited N:
 * LAST LINE"), which aborts a commit of it.  `current` flipping runs --on-commit and reports
 * swapped, its run time being the pause.  At start, the version `current`
 * names goes through the same two hooks, so the server behind them is
 * brought to it, and is reported swapped with pause 0 (start-up is no
 * serving pause).  Without --engine the hooks run the same way and nothing is
 * reported.
 *
 * SIGINT and SIGTERM end the watch with exit 0 (a running hook's process
 * group gets SIGTERM, then SIGKILL); the daemon going away ends it with exit
 * 1; an event the library drops (a malformed one) is a warning.  The command
 * is one thread: signals (SIGCHLD included, so that a hook's end wakes it)
 * arrive through a signalfd, polled beside the watch.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hwfs_api.h" /* first: the public API beside hwfs_common.h */
#include "hwfs_cli.h"

#define WATCH_USAGE                                                                              \
	"hwfs watch [-m MOUNT] [--engine NAME] [--on-arrive CMD] [--on-commit CMD] "           \
	"[--hook-timeout SECONDS] [--any-name]"
#define HOOK_TIMEOUT_DEFAULT_S 600       /* --hook-timeout when not given */
#define HOOK_TIMEOUT_MAX_S (7 * 86400)   /* largest --hook-timeout (0: none) */
#define HOOK_KILL_GRACE_MS 2000          /* SIGTERM to a hook's group, then SIGKILL after this */
#define HOOK_UNSAFE_REASON "version name not safe for hooks"
#define REASON_MAX 512    /* longest refusal reason ("on-arrive hook exited N: " + a line) */
#define LAST_LINE_MAX 384 /* longest last line of a hook's stderr kept for the reason */

/* What the engine reported for a version it handled (arrived or prepared). */
struct handled {
	char version[sizeof(((struct hwfs_event *)0)->version)];
	int loaded; /* 1: loaded; 0: refused for @reason */
	char reason[REASON_MAX];
};

struct watch {
	const char *mount, *engine, *on_arrive, *on_commit;
	unsigned long hook_timeout_s; /* 0: hooks run as long as they like */
	int any_name;                 /* --any-name: hooks run for every version name */
	struct hwfs_watch *w;
	int sigfd;
	int stop; /* SIGINT or SIGTERM arrived */
	struct handled *done;
	size_t n_done, cap_done;
};

/* Print one line on stdout, at once (a pipe reader waits for it). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* Microseconds of the monotonic clock. */
static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/*
 * Has SIGINT or SIGTERM arrived?  Reads the signalfd without waiting
 * (SIGCHLD, there only to wake a poll when a hook ends, is read and dropped).
 */
static int signalled(struct watch *s)
{
	struct signalfd_siginfo si;

	while (read(s->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM)
			s->stop = 1;
	return s->stop;
}

/*
 * May version name @v be handed to a hook (without --any-name)?  1 when it
 * is made of A-Z a-z 0-9 . _ + @ = - only and does not start with '-': no
 * quote, space, '$', '\\', ':' or ',' that a shell line, a JSON body, a URL
 * or a command's options could read as more than a name.  Else 0.
 */
static int hook_safe_name(const char *v)
{
	if (!*v || *v == '-')
		return 0;
	for (; *v; v++)
		if (!(*v >= 'a' && *v <= 'z') && !(*v >= 'A' && *v <= 'Z') &&
		    !(*v >= '0' && *v <= '9') && !strchr("._+@=-", *v))
			return 0;
	return 1;
}

/*
 * Child side of run_hook(): a process group of its own, signals back to
 * normal, the environment, stderr to @errfd, then /bin/sh -c @cmd.  Never
 * returns.
 */
static void exec_hook(struct watch *s, const char *cmd, const char *event, const char *version,
		      int errfd)
{
	char path[PATH_MAX];
	sigset_t none;

	setpgid(0, 0);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	snprintf(path, sizeof(path), "%s/versions/%s", s->mount, version);
	if (setenv("HWFS_VERSION", version, 1) < 0 || setenv("HWFS_PATH", path, 1) < 0 ||
	    setenv("HWFS_MOUNT", s->mount, 1) < 0 || setenv("HWFS_EVENT", event, 1) < 0 ||
	    dup2(errfd, 2) < 0)
		_exit(127);
	execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
	_exit(127);
}

/*
 * Keep the last non-empty line of @buf (@len bytes, cut at newlines by the
 * caller's @line buffer, LAST_LINE_MAX bytes like @last) in @last.
 */
static void keep_last_line(char *line, size_t *used, const char *buf, size_t len, char *last)
{
	for (size_t i = 0; i < len; i++) {
		if (buf[i] == '\n') {
			line[*used] = '\0';
			if (*used)
				memcpy(last, line, *used + 1);
			*used = 0;
		} else if (*used + 1 < LAST_LINE_MAX) {
			line[(*used)++] = buf[i];
		}
	}
}

/*
 * Read what hook output pipe @fd holds now (non-blocking) and pass it through
 * to our stderr, keeping its last line (keep_last_line).  Returns 1 at EOF
 * (every writer closed it), 0 when it is empty for now.
 */
static int pump(int fd, char *line, size_t *used, char *last)
{
	char buf[4096];

	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN ? 0 : 1;
		if (n == 0)
			return 1;
		if (write(2, buf, (size_t)n) < 0) {
			/* our stderr is gone: the hook's lines are still kept for the reason */
		}
		keep_last_line(line, used, buf, (size_t)n, last);
	}
}

/*
 * Signal hook process group @pgid: SIGTERM the first time (*@term_at set to
 * now), SIGKILL once HOOK_KILL_GRACE_MS passed since.  Returns the time of
 * the next escalation (UINT64_MAX once SIGKILL was sent).
 */
static uint64_t stop_group(pid_t pgid, uint64_t *term_at, uint64_t now)
{
	if (!*term_at) {
		*term_at = now;
		kill(-pgid, SIGTERM);
		return now + HOOK_KILL_GRACE_MS * 1000u;
	}
	if (now >= *term_at + HOOK_KILL_GRACE_MS * 1000u) {
		kill(-pgid, SIGKILL);
		return UINT64_MAX;
	}
	return *term_at + HOOK_KILL_GRACE_MS * 1000u;
}

/*
 * Run hook @cmd for @event of @version, in a process group of its own, and
 * wait for its shell to exit, passing its stderr through to ours.  The hook
 * is done when the shell exits: what it wrote is read then, and a background
 * child that still holds the pipe is not waited for.  Past --hook-timeout,
 * or at SIGINT/SIGTERM (s->stop set), its group gets SIGTERM, then SIGKILL.
 * *@why gets "" when it exited 0, else "on-EVENT hook exited N: LAST LINE",
 * "... killed by signal N: ..." or "... timed out after N s: ...".
 * *@took_us: its run time.  Returns 0 (the hook ran; see *@why) or -errno
 * (it could not be started).
 */
static int run_hook(struct watch *s, const char *cmd, const char *hook, const char *event,
		    const char *version, char why[REASON_MAX], uint64_t *took_us)
{
	char last[LAST_LINE_MAX] = "", line[LAST_LINE_MAX];
	uint64_t t0 = mono_us(), term_at = 0, next_kill = UINT64_MAX;
	uint64_t limit = s->hook_timeout_s ? t0 + s->hook_timeout_s * 1000000u : UINT64_MAX;
	size_t used = 0;
	int p[2], status = 0, r = 0, timed_out = 0, reaped = 0;
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	if (fcntl(p[0], F_SETFL, O_NONBLOCK) < 0) {
		r = -errno;
		goto out;
	}
	pid = fork();
	if (pid < 0) {
		r = -errno;
		goto out;
	}
	if (pid == 0)
		exec_hook(s, cmd, event, version, p[1]);
	setpgid(pid, pid); /* here too: the group exists before we may signal it */
	close(p[1]);
	p[1] = -1;
	for (;;) {
		struct pollfd fds[2] = {{.fd = p[0], .events = POLLIN},
					{.fd = s->sigfd, .events = POLLIN}};
		uint64_t now = mono_us(), until;
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid || (w < 0 && errno == ECHILD)) {
			reaped = 1;
			break;
		}
		if (now >= limit && !term_at)
			timed_out = 1;
		if (timed_out || s->stop)
			next_kill = stop_group(pid, &term_at, now);
		until = term_at ? next_kill : limit;
		if (poll(fds, 2, until == UINT64_MAX ? -1 : (int)HWFS_MIN((until - now + 999) / 1000,
									  (uint64_t)INT32_MAX)) < 0 &&
		    errno != EINTR)
			break;
		if (fds[1].revents)
			signalled(s);
		if (p[0] >= 0 && fds[0].revents && pump(p[0], line, &used, last)) {
			close(p[0]); /* EOF: the hook and its children closed it */
			p[0] = -1;
		}
	}
	if (!reaped) { /* poll failed: end the hook rather than leave it unwatched */
		kill(-pid, SIGKILL);
		while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
			;
	}
	if (p[0] >= 0)
		pump(p[0], line, &used, last); /* what it wrote before it exited */
	if (used) {
		line[used] = '\0';
		memcpy(last, line, used + 1);
	}
	*took_us = mono_us() - t0;
	why[0] = '\0';
	if (timed_out)
		snprintf(why, REASON_MAX, "%s hook timed out after %lu s%s%s", hook,
			 s->hook_timeout_s, last[0] ? ": " : "", last);
	else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
		snprintf(why, REASON_MAX, "%s hook exited %d%s%s", hook, WEXITSTATUS(status),
			 last[0] ? ": " : "", last);
	else if (WIFSIGNALED(status))
		snprintf(why, REASON_MAX, "%s hook killed by signal %d%s%s", hook,
			 WTERMSIG(status), last[0] ? ": " : "", last);
out:
	if (p[0] >= 0)
		close(p[0]);
	if (p[1] >= 0)
		close(p[1]);
	return r;
}

/* Send a report; a daemon that is gone ends the watch (exit 1). */
static void report(struct watch *s, enum hwfs_report what, const char *version,
		   const char *reason, uint64_t pause_us)
{
	if (hwfs_engine_report(s->w, what, version, reason, pause_us) < 0)
		die("%s", hwfs_errmsg());
}

/* The record of @version among the handled ones, or NULL. */
static struct handled *find_handled(struct watch *s, const char *version)
{
	for (size_t i = 0; i < s->n_done; i++)
		if (!strcmp(s->done[i].version, version))
			return &s->done[i];
	return NULL;
}

/* Forget @version (it was removed). */
static void forget(struct watch *s, const char *version)
{
	struct handled *h = find_handled(s, version);

	if (h)
		*h = s->done[--s->n_done];
}

/*
 * Run --on-arrive for @version and, as an engine, report loading then loaded
 * or refused.  A version loaded before is not loaded again: a later call
 * re-sends "loaded" when @resend (a commit's prepare).  A version refused
 * before is asked again when @resend: the barrier does not count an earlier
 * refusal, the engine may load the version now (docs/engines.md, "The
 * barrier, exactly"), so its record is dropped and the hook runs anew.
 * A name hooks may not see (hook_safe_name, without --any-name) is refused
 * without running one.  Returns the record, or NULL when SIGINT/SIGTERM
 * stopped the hook (nothing is recorded or reported then: the watch ends).
 */
static struct handled *shadow_load(struct watch *s, const char *version, int resend)
{
	struct handled *h = find_handled(s, version);
	uint64_t took = 0;

	if (h && !h->loaded && resend) {
		forget(s, version);
		h = NULL;
	}
	if (h) {
		if (resend && s->engine)
			report(s, HWFS_LOADED, version, NULL, 0);
		return h;
	}
	if (s->n_done == s->cap_done) {
		size_t ncap = s->cap_done ? s->cap_done * 2 : 8;
		struct handled *nd = realloc(s->done, ncap * sizeof(*nd));

		if (!nd)
			die("out of memory");
		s->done = nd;
		s->cap_done = ncap;
	}
	h = &s->done[s->n_done++];
	memset(h, 0, sizeof(*h));
	snprintf(h->version, sizeof(h->version), "%s", version);
	if (s->engine)
		report(s, HWFS_LOADING, version, NULL, 0);
	if ((s->on_arrive || s->on_commit) && !s->any_name && !hook_safe_name(version)) {
		snprintf(h->reason, sizeof(h->reason), "%s", HOOK_UNSAFE_REASON);
	} else if (s->on_arrive) {
		int r = run_hook(s, s->on_arrive, "on-arrive", "arrived", version, h->reason, &took);

		if (r < 0)
			snprintf(h->reason, sizeof(h->reason), "on-arrive hook could not start: %s",
				 strerror(-r));
		if (s->stop) {
			s->n_done--; /* h is the last record */
			return NULL;
		}
	}
	h->loaded = !h->reason[0];
	/* Report first, then print: a line read from the watch means the
	 * daemon has the report (a script may commit on seeing it). */
	if (s->engine)
		report(s, h->loaded ? HWFS_LOADED : HWFS_REFUSED, version, h->reason, 0);
	if (h->loaded)
		say("loaded %s", version);
	else
		say("refused %s: %s", version, h->reason);
	return h;
}

/*
 * `current` names @version: run --on-commit (after --on-arrive if the version
 * was not handled yet; not at all if it was refused) and, as an engine,
 * report swapped with the hook's run time, or @pause0 with pause 0.
 */
static void swap_to(struct watch *s, const char *version, int pause0)
{
	struct handled *h = shadow_load(s, version, 0);
	char why[REASON_MAX] = "";
	uint64_t took = 0, pause_us;
	int r = 0;

	if (!h)
		return;
	if (!h->loaded) {
		say("not swapping to %s: it was refused", version);
		return;
	}
	if (s->on_commit)
		r = run_hook(s, s->on_commit, "on-commit", "current", version, why, &took);
	if (s->stop)
		return; /* the hook was stopped with the watch: nothing to report */
	if (r < 0 || why[0]) {
		say("swap to %s failed: %s", version,
		    r < 0 ? "the on-commit hook could not start" : why);
		return;
	}
	pause_us = pause0 ? 0 : took;
	if (s->engine)
		report(s, HWFS_SWAPPED, version, NULL, pause_us);
	say("swapped %s (pause %llu us)", version, (unsigned long long)pause_us);
}

/* Print event @ev and act on it. */
static void handle(struct watch *s, const struct hwfs_event *ev)
{
	switch (ev->type) {
	case HWFS_EV_ARRIVED:
		say("arrived %s", ev->version);
		if (s->engine || s->on_arrive)
			shadow_load(s, ev->version, 0);
		break;
	case HWFS_EV_PREPARE:
		say("prepare %s", ev->version);
		shadow_load(s, ev->version, 1);
		break;
	case HWFS_EV_CURRENT:
		say("current %s", ev->version);
		if (s->engine || s->on_commit)
			swap_to(s, ev->version, 0);
		break;
	case HWFS_EV_REMOVED:
		say("removed %s", ev->version);
		forget(s, ev->version);
		break;
	}
}

/* Parse the options into @s. Exits 2 on a usage error, 0 for --help. */
static void watch_opts(int argc, char **argv, struct watch *s)
{
	static const struct option lo[] = {
		{"mount", required_argument, NULL, 'm'},     {"engine", required_argument, NULL, 'E'},
		{"on-arrive", required_argument, NULL, 'A'}, {"on-commit", required_argument, NULL, 'C'},
		{"hook-timeout", required_argument, NULL, 'T'}, {"any-name", no_argument, NULL, 'N'},
		{"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
	};
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "m:h", lo, NULL)) != -1) {
		switch (c) {
		case 'm':
			s->mount = optarg;
			break;
		case 'E':
			s->engine = optarg;
			break;
		case 'A':
			s->on_arrive = optarg;
			break;
		case 'C':
			s->on_commit = optarg;
			break;
		case 'T':
			errno = 0;
			s->hook_timeout_s = strtoul(optarg, &end, 10);
			if (errno || *end || end == optarg || optarg[0] == '-' ||
			    s->hook_timeout_s > HOOK_TIMEOUT_MAX_S)
				usage_die(WATCH_USAGE);
			break;
		case 'N':
			s->any_name = 1;
			break;
		case 'h':
			printf("usage: %s\n", WATCH_USAGE);
			exit(0);
		default:
			usage_die(WATCH_USAGE);
		}
	}
	if (optind != argc)
		usage_die(WATCH_USAGE);
}

/*
 * `hwfs watch`: open the watch (registering the engine), bring the server to
 * `current`, then print and act on events until a signal (returns 0) or the
 * daemon goes away (exits 1).
 */
int cmd_watch(int argc, char **argv)
{
	struct watch s = {.sigfd = -1, .hook_timeout_s = HOOK_TIMEOUT_DEFAULT_S};
	struct hwfs_event ev;
	struct hwfs *h = NULL;
	char *cur = NULL;
	sigset_t sigs;
	int r;

	watch_opts(argc, argv, &s);
	if (hwfs_open(s.mount, &h) < 0)
		die("%s", hwfs_errmsg());
	s.mount = hwfs_mountpoint(h);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGCHLD); /* only wakes a poll when a hook ends (run_hook) */
	if (sigprocmask(SIG_BLOCK, &sigs, NULL) < 0 ||
	    (s.sigfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
		die("cannot set up signal handling: %s", strerror(errno));
	if (hwfs_watch_open(h, s.engine, &cur, &s.w) < 0)
		die("%s", hwfs_errmsg());
	if (s.engine)
		say("registered as engine %s on %s", s.engine, s.mount);
	if (cur) {
		say("current %s", cur);
		if (s.engine || s.on_arrive || s.on_commit)
			swap_to(&s, cur, 1);
		free(cur);
	}
	while (!signalled(&s)) {
		struct pollfd fds[2] = {{.fd = hwfs_watch_fd(s.w), .events = POLLIN},
					{.fd = s.sigfd, .events = POLLIN}};

		while (!s.stop && ((r = hwfs_watch_next(s.w, 0, &ev)) == 0 || r == -EPROTO)) {
			if (r == 0)
				handle(&s, &ev);
			else /* the library dropped a malformed event: say so, read on */
				fprintf(stderr, "hwfs: warning: %s\n", hwfs_errmsg());
		}
		if (s.stop)
			break;
		if (r != -ETIMEDOUT)
			die("%s", hwfs_errmsg());
		if (poll(fds, 2, -1) < 0 && errno != EINTR)
			die("waiting for events: %s", strerror(errno));
	}
	hwfs_watch_close(s.w);
	hwfs_close(h);
	free(s.done);
	close(s.sigfd);
	return 0;
}
