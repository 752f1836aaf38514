// Prints the host crowd benchmark's JSON line (edge/examples/crowd.rs) as
// a markdown table (run by scripts/bench-edge).
const h = JSON.parse(process.argv[2]);
console.log(`\n### Sharded pre-queue draw on the host: ${h.entrants.toLocaleString('en')} entrants over ${h.shards} shards (in-memory stores, release build, one thread)\n`);
console.log('| figure | value | target |');
console.log('|---|---|---|');
console.log(`| slowest draw step (${h.draw_steps} steps in all, ${h.draw_cpu_ms_total} ms) | ${h.max_step_ms} ms | ≤ 100 ms |`);
console.log(`| largest shard's state (entrants + values + buckets) | ${h.max_shard_mb} MB | ≤ 32 MB |`);
console.log(`| everyone's global place (${h.buckets} buckets) | ${(h.all_places_ms / 1000).toFixed(1)} s (${h.per_place_us} µs a person) | — |`);
console.log(`| account → shard spread, max deviation from even | ${(h.spread_max * 100).toFixed(1)} % | within 10 % |`);
console.log(`| places are a permutation of 1..${h.entrants} | ${h.permutation} | true |`);
