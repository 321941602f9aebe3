// SPDX-License-Identifier: MIT
/*
 * Replays inputs through one fuzz target's LLVMFuzzerTestOneInput(), without
 * libFuzzer: the regression tests of the fuzz targets. Built with the
 * configuration's compiler (gcc, clang, SANITIZE=1) once per target, with
 * FUZZ_TARGET naming it; `make unit` (make fuzz-replay) replays
 * tests/fuzz/crashes/<target>-* and tests/fuzz/corpus/<target>/.
 *
 *   build/tests/fuzz/replay_meta FILE|DIR...
 *
 * A directory stands for its regular files whose names do not start with
 * '.', in name order. Each input is read into a buffer of exactly its
 * length (as libFuzzer does, so the sanitizers see a read past it) and run
 * in a child process of its own, so that an input that crashes (a signal,
 * a sanitizer's report, the target's abort()) or runs longer than
 * TIMEOUT_S seconds is named and the others still run. Prints each failed
 * input and "<target>: N inputs replayed, N failed"; exits 1 if any failed
 * or could not be read.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef FUZZ_TARGET
#define FUZZ_TARGET "fuzz target"
#endif
#define TIMEOUT_S 60

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned ninputs, nfailed;

/* The file's bytes in a buffer of exactly its length (malloc(1) when
 * empty), or NULL. */
static uint8_t *slurp(const char *path, size_t *len)
{
	uint8_t *buf = NULL;
	struct stat st;
	FILE *f;

	f = fopen(path, "rb");
	if (!f)
		return NULL;
	if (fstat(fileno(f), &st) || st.st_size < 0)
		goto out;
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (buf && fread(buf, 1, st.st_size, f) != (size_t)st.st_size) {
		free(buf);
		buf = NULL;
	}
	*len = st.st_size;
out:
	fclose(f);
	return buf;
}

static void replay(const char *path)
{
	size_t len = 0;
	uint8_t *buf;
	pid_t pid;
	int st;

	ninputs++;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		buf = slurp(path, &len);
		if (!buf) {
			fprintf(stderr, "%s: cannot read: %s\n", path,
				strerror(errno));
			exit(2);
		}
		alarm(TIMEOUT_S);
		LLVMFuzzerTestOneInput(buf, len);
		free(buf);
		exit(0); /* LeakSanitizer checks at exit */
	}
	if (waitpid(pid, &st, 0) != pid) {
		perror("waitpid");
		exit(1);
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return;
	nfailed++;
	if (WIFSIGNALED(st))
		printf("FAILED: %s: %s%s\n", path, strsignal(WTERMSIG(st)),
		       WTERMSIG(st) == SIGALRM ? " (timed out)" : "");
	else
		printf("FAILED: %s: exit %d\n", path, WEXITSTATUS(st));
}

static int visible(const struct dirent *d)
{
	return d->d_name[0] != '.';
}

static void replay_dir(const char *dir)
{
	struct dirent **names;
	char path[4096];
	struct stat st;
	int i, n;

	n = scandir(dir, &names, visible, alphasort);
	if (n < 0) {
		printf("FAILED: %s: %s\n", dir, strerror(errno));
		nfailed++;
		return;
	}
	for (i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s%s%s", dir,
			 dir[strlen(dir) - 1] == '/' ? "" : "/",
			 names[i]->d_name);
		if (!stat(path, &st) && S_ISREG(st.st_mode))
			replay(path);
		free(names[i]);
	}
	free(names);
}

int main(int argc, char **argv)
{
	struct stat st;
	int i;

	for (i = 1; i < argc; i++) {
		if (!stat(argv[i], &st) && S_ISDIR(st.st_mode))
			replay_dir(argv[i]);
		else
			replay(argv[i]);
	}
	printf("%s: %u inputs replayed, %u failed\n", FUZZ_TARGET, ninputs,
	       nfailed);
	return nfailed ? 1 : 0;
}
