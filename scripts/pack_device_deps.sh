#!/usr/bin/env bash
# Copies the dependencies that the GPU image lacks into .devdeps/ (git-ignored;
# name it in the device tool's `carry`): utf8proc (header and shared library),
# and header-only ones: toml++ from Debian's
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

# utf8proc (tokenizer normalizers): Debian's header and shared library with a
# relocatable pkg-config file; device_build.sh points pkg-config at it when the
# image has none. Real files, no links (the soname file is what runs).
so=$(readlink -f /usr/lib/x86_64-linux-gnu/libutf8proc.so)
mkdir -p .devdeps/utf8proc/include .devdeps/utf8proc/lib/pkgconfig
cp /usr/include/utf8proc.h .devdeps/utf8proc/include/
soname=$(objdump -p "$so" | awk '/SONAME/ {print $2}')
cp "$so" ".devdeps/utf8proc/lib/$soname"
cp "$so" .devdeps/utf8proc/lib/libutf8proc.so
sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
  /usr/lib/x86_64-linux-gnu/pkgconfig/libutf8proc.pc > .devdeps/utf8proc/lib/pkgconfig/libutf8proc.pc
du -sh .devdeps
