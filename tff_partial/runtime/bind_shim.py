"""A tiny LD_PRELOAD library that makes TFF's `worker_binary` listen on one address.

Why it exists: TFF 0.87's C++ worker (`tensorflow_federated/data/worker_binary`)
has only `--port` and `--max_concurrent_computation_calls` flags and listens on
`[::]:PORT`, i.e. on every interface of the machine. Nothing in TFF lets a
caller choose the address, yet a worker runs any TensorFlow graph it is sent
(file I/O included), over plaintext, unauthenticated gRPC. The binary is
dynamically linked and calls libc's `bind(2)`, so this shim (written here; no
library offers it) wraps `bind` and rewrites the worker's wildcard bind on its
port to the requested address:

* `TFF_PARTIAL_BIND_HOST` / `TFF_PARTIAL_BIND_PORT`: an any-address bind
  (`::` or `0.0.0.0`) on that port becomes a bind to the host (an IPv4 host on
  gRPC's dual-stack IPv6 socket becomes its v4-mapped form `::ffff:a.b.c.d`,
  which accepts IPv4 connections to that address only). Other binds pass
  through unchanged.
* `TFF_PARTIAL_PARENT_PID`: at load time the worker asks the kernel to
  SIGKILL it when its parent dies (`prctl(PR_SET_PDEATHSIG)`), and exits at
  once if that parent is already gone, so a parent killed by SIGKILL leaves
  no orphan worker.

`tff_partial.runtime.workers.start_worker` also reads the worker's listening
sockets back from /proc and refuses a worker that listens anywhere else, so a
shim that failed to load cannot go unnoticed.

The shim is compiled once with the system C compiler (`cc`) into a cache
directory (`$TFF_PARTIAL_CACHE_DIR`, else `$XDG_CACHE_HOME/tff_partial`, else
`~/.cache/tff_partial`); `make setup` builds it ahead of time.
"""

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

_SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int bind_port = -1;
static int have_v4, have_v6;
static struct in_addr host_v4;
static struct in6_addr host_v6;

__attribute__((constructor)) static void tff_partial_shim_init(void) {
  const char *parent = getenv("TFF_PARTIAL_PARENT_PID");
  if (parent && *parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if ((long)getppid() != atol(parent)) _exit(111); /* parent already gone */
  }
  const char *host = getenv("TFF_PARTIAL_BIND_HOST");
  const char *port = getenv("TFF_PARTIAL_BIND_PORT");
  if (!host || !*host || !port || !*port) return;
  if (inet_pton(AF_INET, host, &host_v4) == 1) {
    have_v4 = 1;
  } else if (inet_pton(AF_INET6, host, &host_v6) == 1) {
    have_v6 = 1;
  } else {
    _exit(112); /* not an IP address: refuse to listen anywhere */
  }
  bind_port = atoi(port);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr *, socklen_t))
      dlsym(RTLD_NEXT, "bind");
  if (bind_port < 0 || !addr) return real_bind(fd, addr, len);
  if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (ntohs(a.sin6_port) == bind_port && IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      if (have_v6) {
        a.sin6_addr = host_v6;
      } else {
        memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
        a.sin6_addr.s6_addr[10] = 0xff;
        a.sin6_addr.s6_addr[11] = 0xff;
        memcpy(&a.sin6_addr.s6_addr[12], &host_v4, 4);
      }
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  } else if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (ntohs(a.sin_port) == bind_port && a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      if (!have_v4) {
        errno = EADDRNOTAVAIL; /* an IPv6 host: no IPv4 wildcard either */
        return -1;
      }
      a.sin_addr = host_v4;
      return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}
"""


class ShimError(RuntimeError):
  """The bind shim cannot be built (no C compiler) or failed to compile."""


def _cache_dir() -> str:
  explicit = os.environ.get('TFF_PARTIAL_CACHE_DIR')
  if explicit:
    return explicit
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'tff_partial')


def shim_path() -> str:
  """Path of the compiled shim, building it on first use.

  Raises:
    ShimError: no C compiler, or compilation failed.
  """
  digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
  path = os.path.join(_cache_dir(), f'bind_shim-{platform.machine()}-{digest}.so')
  if os.path.isfile(path):
    return path
  compiler = os.environ.get('CC') or shutil.which('cc') or shutil.which('gcc')
  if not compiler:
    raise ShimError(
        'building the loopback-bind shim for TFF workers needs a C compiler '
        '(cc/gcc; Debian: apt-get install gcc). TFF\'s worker_binary cannot '
        'choose its listening address by itself and would listen on every '
        'interface; see tff_partial/runtime/bind_shim.py')
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
    src = os.path.join(tmp, 'bind_shim.c')
    with open(src, 'w') as f:
      f.write(_SOURCE)
    out = os.path.join(tmp, 'bind_shim.so')
    result = subprocess.run(
        [compiler, '-shared', '-fPIC', '-O2', '-Wall', '-o', out, src, '-ldl'],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
      raise ShimError(f'compiling the loopback-bind shim with {compiler} failed: '
                      f'{result.stderr.strip()}')
    os.replace(out, path)  # atomic: concurrent builders each install a whole file
  return path


def worker_environment(bind_host: str, port: int, parent_pid: int) -> dict:
  """Environment variables that load the shim into a worker and configure it.

  `bind_host` None: listen where TFF's worker listens by itself (every
  interface); the parent-death signal is set either way.
  """
  env = {'LD_PRELOAD': shim_path(), 'TFF_PARTIAL_PARENT_PID': str(parent_pid)}
  if bind_host is not None:
    env['TFF_PARTIAL_BIND_HOST'] = bind_host
    env['TFF_PARTIAL_BIND_PORT'] = str(port)
  return env


if __name__ == '__main__':  # `make setup` builds the shim ahead of time
  try:
    print(shim_path())
  except ShimError as e:
    raise SystemExit(f'error: {e}') from None
