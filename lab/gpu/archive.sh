# The device calls' archives, sourced by gpu_paper.sh and gpu_sraven_verdict.sh. A device call returns files of at
# most 16 MiB, so an archive over PART_MIB (default 15) is split into ARCHIVE.part-000, -001, ...; RESUME_FROM
# names the archive, or the name its parts share.

part_bytes=$(awk "BEGIN { printf \"%d\", ${PART_MIB:-15} * 1048576 }")

unpack_archive() {  # unpack_archive NAME: the archive NAME, or its parts, over the working tree
  if [ -f "$1" ]; then
    tar -xzmf "$1"
  elif compgen -G "$1.part-*" >/dev/null; then
    cat "$1".part-* | tar -xzmf -
  else
    echo "RESUME_FROM=$1: no such archive, nor parts of one" >&2
    exit 2
  fi
  echo "continued from $1"
}

pack_archive() {  # pack_archive ARCHIVE LIST: the files named in LIST, in parts when over part_bytes
  local archive=$1 list=$2 bytes files
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive" "$archive".part-*
  tar -czf "$archive" -T "$list"
  bytes=$(stat -c %s "$archive")
  files=$(wc -l < "$list")
  if [ "$bytes" -gt "$part_bytes" ]; then
    split -b "$part_bytes" -d -a 3 "$archive" "$archive.part-"
    rm "$archive"
    echo "archive: $archive.part-* ($files files, $bytes bytes in $(compgen -G "$archive.part-*" | wc -l) parts)"
  else
    echo "archive: $archive ($files files, $bytes bytes)"
  fi
  echo "  a later call continues with RESUME_FROM=$archive (the file, or its parts side by side)"
}
