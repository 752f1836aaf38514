//! `origin audit draw`: the independent verifier of a sale's draw (issue
//! 15 #6). It downloads what the edge publishes — the summary's `draw`
//! object and the whole listing (`GET /api/sales/{sale}/draw?from=&limit=`)
//! — or reads a saved copy, and re-derives everything with the pure checks
//! of `draw::audit` (commitment, Merkle root and count, key, every value,
//! the ranks; a receipt's leaf, audit path and place). With a beacon named
//! it also asks the beacon for the round's randomness and compares.
//!
//! Invariant: it trusts nothing it downloads; every field is parsed and
//! checked, and the first discrepancy is named (exit 1).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use draw::audit::{Entry, Published, Receipt, audit, audit_receipt};
use serde_json::Value;

/// Most entries asked for per listing page (the edge bounds pages too).
const PAGE: u64 = 512;

/// What the verifier reads: the summary, the listing, and a receipt.
#[derive(Debug, Clone)]
pub struct Documents {
    /// The edge's `GET /api/sales/{sale}` answer (its `draw` object).
    pub summary: Value,
    /// Every listing entry `{place, leaf, value}`, in order.
    pub entries: Vec<Value>,
    /// An entrant's receipt (`GET …/queue/receipt`), optionally with the
    /// `account` it belongs to (the page saves it so).
    pub receipt: Option<Value>,
}

fn hash(v: &Value, what: &str) -> anyhow::Result<draw::Hash> {
    v.as_str()
        .and_then(draw::from_hex)
        .with_context(|| format!("{what} is not 64 lowercase hex digits: {v}"))
}

fn bytes(v: &Value, what: &str) -> anyhow::Result<Vec<u8>> {
    v.as_str()
        .and_then(|s| hex::decode(s).ok())
        .with_context(|| format!("{what} is not hex: {v}"))
}

/// The beacon round the summary names, if any: `(round, value)`.
fn beacon_of(d: &Value) -> anyhow::Result<Option<(u64, Vec<u8>)>> {
    match &d["beacon"] {
        Value::String(s) if s == "none" => Ok(None),
        b @ Value::Object(_) if b["missed"] == true && b["round"].is_null() => {
            // The beacon never told its rounds: drawn without it (round 0).
            Ok(Some((0, Vec::new())))
        }
        b @ Value::Object(_) => {
            let round = b["round"].as_u64().context("draw.beacon.round")?;
            // A beacon that did not answer in time leaves the value empty.
            let value = match &b["value"] {
                Value::Null => Vec::new(),
                v => bytes(v, "draw.beacon.value")?,
            };
            Ok(Some((round, value)))
        }
        other => bail!("draw.beacon is neither \"none\" nor {{round, value}}: {other}"),
    }
}

/// Parses the documents into what `draw::audit` checks.
pub fn published(docs: &Documents) -> anyhow::Result<Published> {
    let d = &docs.summary["draw"];
    anyhow::ensure!(d.is_object(), "the summary has no draw object");
    let mut entries = Vec::with_capacity(docs.entries.len());
    for (i, e) in docs.entries.iter().enumerate() {
        entries.push(Entry {
            place: e["place"]
                .as_u64()
                .with_context(|| format!("listing entry {i}: place"))?,
            leaf: hash(&e["leaf"], &format!("listing entry {i}: leaf"))?,
            value: hash(&e["value"], &format!("listing entry {i}: value"))?,
        });
    }
    Ok(Published {
        commitment: hash(&d["commitment"], "draw.commitment")?,
        seed: bytes(&d["seed"], "draw.seed (published after the draw)")?,
        entrants: d["entrants"].as_u64().context("draw.entrants")?,
        entrants_root: hash(&d["entrants_root"], "draw.entrants_root")?,
        beacon: beacon_of(d)?.map(|(_, v)| v).unwrap_or_default(),
        key: hash(&d["key"], "draw.key")?,
        entries,
    })
}

fn receipt(v: &Value) -> anyhow::Result<(Option<String>, Receipt)> {
    let salt: [u8; 16] = bytes(&v["salt"], "receipt.salt")?
        .try_into()
        .map_err(|_| anyhow::anyhow!("receipt.salt is not 16 bytes"))?;
    let path = v["audit_path"]
        .as_array()
        .context("receipt.audit_path")?
        .iter()
        .map(|h| hash(h, "receipt.audit_path"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok((
        v["account"].as_str().map(str::to_string),
        Receipt {
            leaf: hash(&v["leaf"], "receipt.leaf")?,
            salt,
            leaf_index: v["leaf_index"].as_u64().context("receipt.leaf_index")?,
            audit_path: path,
            place: v["place"].as_u64().context("receipt.place")?,
        },
    ))
}

/// Runs every check; `Ok(report lines)` when all pass, else the first
/// discrepancy as the error.
pub fn check(docs: &Documents) -> anyhow::Result<Vec<String>> {
    let p = published(docs)?;
    audit(&p).map_err(|d| anyhow::anyhow!("discrepancy: {d}"))?;
    let mut report = vec![
        format!(
            "commitment matches the seed: {}",
            draw::to_hex(&p.commitment)
        ),
        format!(
            "{} entrants; their sorted leaves have the published root {}",
            p.entrants,
            draw::to_hex(&p.entrants_root)
        ),
        format!(
            "key = SHA-256(seed ‖ root ‖ beacon) with {}",
            if p.beacon.is_empty() {
                "no beacon value".to_string()
            } else {
                format!("beacon value {}", hex::encode(&p.beacon))
            }
        ),
        format!(
            "every value is SHA-256(key ‖ leaf) and places 1..{} are their ranks",
            p.entrants
        ),
    ];
    if let Some(r) = &docs.receipt {
        let (account, r) = receipt(r)?;
        match account {
            Some(a) => {
                audit_receipt(&p, &a, &r).map_err(|d| anyhow::anyhow!("discrepancy: {d}"))?;
                report.push(format!(
                    "receipt: {a}'s leaf is in the tree at index {} and at place {}",
                    r.leaf_index, r.place
                ));
            }
            None => {
                bail!("the receipt names no account: add \"account\" to check whose leaf it is")
            }
        }
    }
    Ok(report)
}

/// Downloads the summary and the whole listing from an edge.
pub async fn download(edge: &str, sale: &str) -> anyhow::Result<Documents> {
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()?;
    let edge = edge.trim_end_matches('/');
    let get = |url: String| {
        let client = client.clone();
        async move {
            let r = client
                .get(&url)
                .send()
                .await
                .with_context(|| format!("GET {url}"))?;
            let status = r.status();
            let v: Value = r
                .json()
                .await
                .with_context(|| format!("GET {url}: not JSON"))?;
            anyhow::ensure!(status.is_success(), "GET {url}: {status} {v}");
            Ok::<Value, anyhow::Error>(v)
        }
    };
    let summary = get(format!("{edge}/api/sales/{sale}")).await?;
    let n = summary["draw"]["entrants"]
        .as_u64()
        .context("the summary's draw has no entrants count: not drawn yet?")?;
    let mut entries = Vec::new();
    let mut from = 1;
    while from <= n {
        let page = get(format!(
            "{edge}/api/sales/{sale}/draw?from={from}&limit={PAGE}"
        ))
        .await?;
        let got = page["entries"].as_array().context("listing: entries")?;
        anyhow::ensure!(!got.is_empty(), "listing ends at place {from} of {n}");
        from += got.len() as u64;
        entries.extend(got.iter().cloned());
    }
    Ok(Documents {
        summary,
        entries,
        receipt: None,
    })
}

/// Asks the sale's beacon for the round the summary names and compares its
/// randomness with the published value (a beacon that did not answer in
/// time is published with no value and nothing to compare).
pub async fn check_beacon(docs: &Documents) -> anyhow::Result<Option<String>> {
    let Some(url) = docs.summary["draw_beacon"].as_str() else {
        return Ok(None);
    };
    let Some((round, value)) = beacon_of(&docs.summary["draw"])? else {
        bail!("discrepancy: the sale names a beacon ({url}) but the draw says none");
    };
    let base = url.trim_end_matches('/');
    if round == 0 && value.is_empty() {
        return Ok(Some(format!(
            "the beacon {base} did not answer in time: the draw went on without it"
        )));
    }
    // The round must be the first published at or after the start.
    let info: Value = reqwest::get(format!("{base}/info"))
        .await
        .with_context(|| format!("GET {base}/info"))?
        .json()
        .await
        .with_context(|| format!("GET {base}/info: not JSON"))?;
    let starts = docs.summary["starts_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .context("the summary's starts_at")?
        .timestamp_millis()
        .max(0) as u64;
    // A start within a second: the first round at or after it.
    let starts = starts.div_ceil(1000);
    let expected = draw::beacon_round(
        info["genesis_time"]
            .as_u64()
            .context("beacon info: genesis_time")?,
        info["period"].as_u64().context("beacon info: period")?,
        starts,
    )
    .context("beacon info: a period of 0")?;
    anyhow::ensure!(
        round == expected,
        "discrepancy: the draw used beacon round {round}; the first round at or after the start is {expected}"
    );
    if value.is_empty() {
        return Ok(Some(format!(
            "the beacon did not answer in time for round {round}: the draw went on without it"
        )));
    }
    let url = format!("{base}/public/{round}");
    let v: Value = reqwest::get(&url)
        .await
        .with_context(|| format!("GET {url}"))?
        .json()
        .await
        .with_context(|| format!("GET {url}: not JSON"))?;
    let theirs = bytes(&v["randomness"], "the beacon's randomness")?;
    anyhow::ensure!(
        theirs == value,
        "discrepancy: the published beacon value for round {round} is not the beacon's ({})",
        hex::encode(&theirs)
    );
    Ok(Some(format!("beacon round {round} matches {url}")))
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// Reads documents saved with `--save` (`summary.json`, `draw.json`).
pub fn load(dir: &Path) -> anyhow::Result<Documents> {
    let listing = read_json(&dir.join("draw.json"))?;
    Ok(Documents {
        summary: read_json(&dir.join("summary.json"))?,
        entries: listing["entries"]
            .as_array()
            .context("draw.json: entries")?
            .clone(),
        receipt: None,
    })
}

/// Saves documents for a later `--from` (and for the record).
pub fn save(dir: &Path, docs: &Documents) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec_pretty(&docs.summary)?,
    )?;
    std::fs::write(
        dir.join("draw.json"),
        serde_json::to_vec(&serde_json::json!({"entries": docs.entries}))?,
    )?;
    Ok(())
}

/// `origin audit draw`: prints what was checked; an error names the first
/// discrepancy (the CLI exits 1).
pub async fn run(
    edge: Option<&str>,
    sale: Option<&str>,
    from: Option<&PathBuf>,
    save_to: Option<&PathBuf>,
    receipt_file: Option<&PathBuf>,
) -> anyhow::Result<()> {
    let mut docs = match (from, edge, sale) {
        (Some(dir), _, _) => load(dir)?,
        (None, Some(edge), Some(sale)) => download(edge, sale).await?,
        _ => bail!("give --edge and --sale, or --from a saved copy"),
    };
    if let Some(dir) = save_to {
        save(dir, &docs)?;
    }
    if let Some(f) = receipt_file {
        docs.receipt = Some(read_json(f)?);
    }
    for line in check(&docs)? {
        println!("ok: {line}");
    }
    if from.is_none()
        && let Some(line) = check_beacon(&docs).await?
    {
        println!("ok: {line}");
    }
    println!("the draw checks out");
    Ok(())
}
