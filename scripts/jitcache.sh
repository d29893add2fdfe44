# JIT disk-cache carry between GPU-machine calls, sourced by gpu_suite.sh and
# gpu_bench.sh. Only cubins this run compiled or loaded go back (entries for
# older headers are never hit again), and the archive comes back in parts of
# at most 15 MiB (the device tool returns files of up to 16 MiB). Locally:
#   cat OUTDIR/jitcache.tgz.* > .deps/jitcache.tgz
jitcache_restore() {  # TGZ
  local tgz="$1"
  mkdir -p "$TESSERA_CACHE_DIR"
  [ -n "$tgz" ] && [ -f "$tgz" ] && tar xzf "$tgz" -C "$TESSERA_CACHE_DIR"
  # Old stamps on every restored file, so a load (relatime) marks it as used.
  find "$TESSERA_CACHE_DIR" -type f -exec touch -d 2000-01-01 {} +
  touch /tmp/tessera-jitcache.marker
}
jitcache_save() {  # OUTDIR
  local out="$1" list=/tmp/tessera-jitcache.list
  (cd "$TESSERA_CACHE_DIR" && find . -type f \( -newer /tmp/tessera-jitcache.marker -o -anewer /tmp/tessera-jitcache.marker \) \
    -printf '%P\n') >"$list"
  rm -f "$out"/jitcache.tgz*
  tar czf "$out/jitcache.tgz" -C "$TESSERA_CACHE_DIR" -T "$list"
  split -b 15m -d -a 1 "$out/jitcache.tgz" "$out/jitcache.tgz." && rm -f "$out/jitcache.tgz"
  echo "jit cache saved: $(grep -c cubin "$list") cubins used -> $out/jitcache.tgz.*"
}
