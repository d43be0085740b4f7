"""The helpers every escape probe runs with: try one thing, name the errno, never raise.

A probe is Python run in another process (a confined child, or a container), so these are
source text, prepended to the probe's own code.
"""

HELPERS = r"""
import errno, json, os, socket, sys

def attempt(fn):
    # "allowed", or the name of the errno the kernel answered with
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "allowed"

def read_at(dir_fd, name):
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)

def create_at(dir_fd, name, data=b"x", mode=0o600):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
    os.write(fd, data)
    os.close(fd)
"""
