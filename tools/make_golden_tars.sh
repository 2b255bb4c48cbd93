#!/usr/bin/env bash
# Build the golden tar shards in tests/golden/tar/ with GNU tar, the reference tar writer.
#
# The tests read these files with shardmix and with webdataset and check that both group
# them exactly as tests/golden/tar/expected.json says (that file is written by hand; this
# script only writes the archives). Run it from anywhere; it needs GNU tar (1.28 or later,
# for --sort) and gzip. The output is reproducible: sorted names, mtime 0, owner 0, fixed
# modes, pax headers without atime/ctime or process ids, gzip without name or time.
#
# The tree covers: several keys, multi-dot fields (x.seg.png), an upper-case extension
# (read as lower case), nested directories (directory entries are skipped), a symlink
# (skipped), a name without a dot, a top-level dot file and a __meta__ file (none is a
# sample), a dot file in a directory (webdataset makes the directory its key), and one path
# longer than 100 bytes. That path keeps a '/' where ustar can split it into its 155-byte
# prefix and 100-byte name fields, so all three formats hold the same tree:
#   ustar.tar: POSIX ustar (long path in the prefix field)
#   gnu.tar:   GNU format (long path in a GNU 'L' long-name entry), default 10 KiB records
#   pax.tar:   POSIX pax (long path in a pax 'x' extended header)
#   gnu.tar.gz: gnu.tar compressed
set -euo pipefail

out="$(cd "$(dirname "$0")/.." && pwd)/tests/golden/tar"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 022
mkdir -p "$out" "$work/tree"
cd "$work/tree"

long_dir="deep/$(printf 'a%.0s' {1..60})/$(printf 'b%.0s' {1..40})"
mkdir -p nested/dir "$long_dir" __meta__

printf 'cat' > sample0001.cls
printf '\x89PNG\r\n\x1a\n\x00\x01\x02\xff' > sample0001.seg.png
printf 'first sample\n' > sample0001.txt
printf '{"label": 2}' > sample0002.json
printf 'UPPER' > sample0002.TXT
printf 'nested three\n' > nested/dir/sample0003.txt
printf '3' > nested/dir/sample0003.cls
printf 'far away\n' > "$long_dir/sample0004.txt"
printf 'not a sample\n' > README
printf 'shard metadata\n' > __meta__/info.json
printf 'hidden top\n' > .hidden
printf 'dir notes\n' > nested/dir/.notes
ln -s sample0001.txt zz_link.txt
chmod 0644 $(find . -type f)

common=(--sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=go-w,a+rX)
members=(.hidden README __meta__ deep nested sample0001.cls sample0001.seg.png sample0001.txt
  sample0002.TXT sample0002.json zz_link.txt)
tar "${common[@]}" --format=ustar -b 1 -cf "$out/ustar.tar" "${members[@]}"
tar "${common[@]}" --format=gnu -cf "$out/gnu.tar" "${members[@]}"
tar "${common[@]}" --format=pax -b 1 \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$out/pax.tar" "${members[@]}"
gzip -n -9 -c "$out/gnu.tar" > "$out/gnu.tar.gz"
ls -l "$out"
