#!/usr/bin/env bash
# A prose corpus offline, from a package registry: the reStructuredText sources of the CPython 3.11 documentation
# (tutorial, how-tos, language and library reference, what's new: about 500 files, 12 MB of English technical
# prose with examples) from Debian's python3.11-doc package, for data.corpus=DIR beside the stdlib's code.
# Usage: bash lab/lm/fetch_pydocs.sh [DIR]     (default .corpora/python-docs; needs apt-get and dpkg-deb)
# then:  hyla train lm_tiny data.corpus=.corpora/python-docs ...   (a folder corpus reads its *.txt files)
set -euo pipefail
out=${1:-.corpora/python-docs}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download python3.11-doc >/dev/null)
dpkg-deb -x "$tmp"/python3.11-doc_*.deb "$tmp/x"
mkdir -p "$out"
cp -r "$tmp"/x/usr/share/doc/python3.11/html/_sources/. "$out"/
echo "$(find "$out" -name '*.txt' | wc -l) documents ($(du -sh "$out" | cut -f1)) in $out from $(basename "$tmp"/python3.11-doc_*.deb)"
