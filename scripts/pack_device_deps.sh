#!/usr/bin/env bash
# Copies the dependencies that the GPU image lacks into .devdeps/ (git-ignored;
# name it in the device tool's `carry`): utf8proc and Oniguruma (headers and
# shared libraries), and header-only ones: toml++ from Debian's
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

# utf8proc (tokenizer normalizers) and Oniguruma (Split regexes): Debian's
# headers and shared libraries with relocatable pkg-config files, one prefix
# each; device_build.sh points pkg-config at them when the image has none.
# Real files, no links (the soname file is what runs).
pack_library() {  # pkg-config name, headers...
  local name=$1; shift
  local pc=/usr/lib/x86_64-linux-gnu/pkgconfig/$name.pc prefix=.devdeps/$name
  local lib so soname
  lib=$(sed -n 's/^Libs:.*-l\([a-z0-9_]*\).*/\1/p' "$pc")
  so=$(readlink -f "/usr/lib/x86_64-linux-gnu/lib$lib.so")
  soname=$(objdump -p "$so" | awk '/SONAME/ {print $2}')
  mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
  for header in "$@"; do cp "/usr/include/$header" "$prefix/include/"; done
  cp "$so" "$prefix/lib/$soname"
  cp "$so" "$prefix/lib/lib$lib.so"
  sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
    -e 's|^includedir=.*|includedir=${prefix}/include|' "$pc" > "$prefix/lib/pkgconfig/$name.pc"
}
pack_library libutf8proc utf8proc.h
pack_library oniguruma oniguruma.h
du -sh .devdeps
