#!/usr/bin/env bash
# Copies the header-only dependencies that the GPU image lacks into .devdeps/
# (git-ignored; name it in the device tool's `carry`): toml++ from Debian's
# package, and cpp-httplib as upstream's single header (Debian's package splits
# it into declarations and a shared library, which the image lacks) from the
# release tarball Debian packages, checked against its hash. An Ubuntu or
# Debian GPU machine with libcpp-httplib-dev needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .devdeps && mkdir -p .devdeps/include
cp -r /usr/include/toml++ .devdeps/include/

httplib_version=0.11.4
httplib_sha256=8b1a5df569003b6a4f24c68489bbda5c64aec94697bdc9ebba5d79408b2ae7eb
tarball=${XDG_CACHE_HOME:-$HOME/.cache}/colossus/cpp-httplib_${httplib_version}+ds.orig.tar.xz
if ! echo "$httplib_sha256  $tarball" | sha256sum -c --quiet > /dev/null 2>&1; then
  mkdir -p "$(dirname "$tarball")"
  curl -sSfL -o "$tarball" \
    "http://deb.debian.org/debian/pool/main/c/cpp-httplib/cpp-httplib_${httplib_version}+ds.orig.tar.xz"
  echo "$httplib_sha256  $tarball" | sha256sum -c --quiet
fi
tar -xJOf "$tarball" --wildcards '*/httplib.h' > .devdeps/include/httplib.h
grep -q '^inline Server::Server()' .devdeps/include/httplib.h
du -sh .devdeps
