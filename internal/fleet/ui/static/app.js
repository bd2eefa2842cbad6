// gpufleet fleet view. Every value from the cluster is written with
// textContent or as a class/attribute built from a fixed set: never as HTML.
"use strict";

const rows = new Map();      // node -> row
const tiles = new Map();     // node -> button
const pools = new Map();     // group (pool, or domain) -> {section, tiles, counts}
let selected = "";
// domainLabel is set while the MaintenanceOperatorConfig has spec.domains:
// the tiles are then grouped by NVLink domain instead of by pool.
let domainLabel = "";
let domains = new Map();     // domain ("" for none) -> its summary

const stateClass = (s) => "state-" + String(s).replace(/[^a-z]+/g, "-");

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// groupKey is the group of a row's tile: its domain while domains are
// configured, else its pool ("" for none).
const groupKey = (r) => (domainLabel ? r.domain : r.pool) || "";
const groupName = (key) => key || (domainLabel ? "(no domain)" : "(no pool)");
// groupOrder sorts the sections: pools by name ("(no pool)" first, as
// ever), domains by name with the nodes in no domain last.
const groupOrder = (key) => (domainLabel ? (key ? "0" + key : "1") : groupName(key));

function poolOf(key) {
  let p = pools.get(key);
  if (p) return p;
  const section = el("div", "pool");
  section.dataset.pool = groupName(key);
  section.dataset.order = groupOrder(key);
  if (domainLabel) section.dataset.domain = key;
  const h = el("h2", "", groupName(key));
  const counts = el("span", "counts");
  h.appendChild(counts);
  const t = el("div", "tiles");
  section.append(h, t);
  // keep the groups sorted
  const container = document.getElementById("pools");
  const after = [...container.children].find((c) => c.dataset.order > section.dataset.order);
  container.insertBefore(section, after || null);
  p = { section, tiles: t, counts };
  pools.set(key, p);
  return p;
}

function describe(r) {
  const parts = [r.node, r.state];
  if (r.pool) parts.push("pool " + r.pool);
  if (r.domain) parts.push("domain " + r.domain);
  if (r.computeDomain) parts.push("ComputeDomain " + (r.computeDomain.name || r.computeDomain.uid));
  if (r.problems) parts.push(...r.problems);
  return parts.join(" — ");
}

function newTile(r) {
  const t = el("button", "tile");
  t.type = "button";
  t.dataset.node = r.node;
  t.addEventListener("click", () => explain(r.node));
  tiles.set(r.node, t);
  return t;
}

function paint(t, r) {
  t.className = "tile " + stateClass(r.state) + (selected === r.node ? " selected" : "");
  t.dataset.state = r.state;
  t.title = describe(r);
  t.setAttribute("aria-label", describe(r));
}

// upsert shows one changed row, keeping the tiles of a pool sorted by name.
function upsert(r) {
  const old = rows.get(r.node);
  rows.set(r.node, r);
  const t = tiles.get(r.node) || newTile(r);
  if (!old || groupKey(old) !== groupKey(r) || !t.parentNode) {
    const pool = poolOf(groupKey(r));
    const after = [...pool.tiles.children].find((c) => c.dataset.node > r.node);
    pool.tiles.insertBefore(t, after || null);
  }
  paint(t, r);
}

// load shows a whole snapshot at once: rows arrive sorted by node name
// (grouped by domain), so each group's tiles are appended in order in one
// DOM operation.
function load(list) {
  for (const p of pools.values()) p.section.remove();
  pools.clear();
  rows.clear();
  const frags = new Map();
  for (const r of list) {
    rows.set(r.node, r);
    const t = tiles.get(r.node) || newTile(r);
    paint(t, r);
    const key = groupKey(r);
    if (!frags.has(key)) frags.set(key, document.createDocumentFragment());
    frags.get(key).appendChild(t);
  }
  for (const name of [...tiles.keys()]) if (!rows.has(name)) tiles.delete(name);
  for (const [key, frag] of frags) poolOf(key).tiles.appendChild(frag);
}

// setDomains takes the domain label and summaries of a snapshot or an
// update; when grouping changes (spec.domains set or removed, or another
// label), every tile moves to its new group.
function setDomains(label, list) {
  domains = new Map((list || []).map((d) => [d.name, d]));
  if ((label || "") === domainLabel) return false;
  domainLabel = label || "";
  return true;
}

// domainText says, for a domain's heading, whether it is disrupted and
// what runs there.
function domainText(key, c) {
  const d = domains.get(key);
  let text = `${c.n} nodes, ${c.ready} ready`;
  if (!d) return text;
  text += `, ${d.inMaintenance} in maintenance`;
  if (d.pendingMaintenance) text += `, ${d.pendingMaintenance} pending`;
  if (key) text += d.disrupted ? " — disrupted" : " — not disrupted";
  const pools = (d.pools || []).map((p) => p || "(no pool)");
  if (pools.length) text += " — pool" + (pools.length > 1 ? "s " : " ") + pools.join(", ");
  const cds = d.computeDomains || [];
  if (cds.length) text += " — ComputeDomain " + cds.map((u) => `${u.name || u.uid} on ${u.nodes} node(s)`).join(", ");
  return text;
}

function remove(name) {
  const t = tiles.get(name);
  if (t) t.remove();
  tiles.delete(name);
  rows.delete(name);
}

function render(summary, notes) {
  const s = summary;
  let text = `${s.nodes} nodes: ${s.readyForWork} ready for work, ${s.inMaintenance} in maintenance (${s.draining} draining), ` +
    `${s.repairing} repairing (${s.recoveryFailed} recovery failed), ${s.degraded} degraded; GPUs ${s.gpus}, ${s.gpusInUse} in use, ${s.gpusFaulty} faulty`;
  document.getElementById("summary").textContent = text;
  const byState = new Map();
  const byPool = new Map();
  for (const r of rows.values()) {
    byState.set(r.state, (byState.get(r.state) || 0) + 1);
    const k = groupKey(r);
    const c = byPool.get(k) || { n: 0, ready: 0 };
    c.n++; if (r.state === "ready") c.ready++;
    byPool.set(k, c);
  }
  for (const b of document.querySelectorAll("#legend .count")) b.textContent = String(byState.get(b.dataset.state) || 0);
  for (const [k, p] of pools) {
    const c = byPool.get(k);
    if (!c) { p.section.remove(); pools.delete(k); continue; }
    p.counts.textContent = domainLabel ? domainText(k, c) : `${c.n} nodes, ${c.ready} ready`;
    p.section.classList.toggle("disrupted", Boolean(domainLabel && k && domains.get(k) && domains.get(k).disrupted));
  }
  const n = document.getElementById("notes");
  n.replaceChildren(...(notes || []).map((x) => el("p", "", "note: " + x)));
  document.body.dataset.version = String((Number(document.body.dataset.version) || 0) + 1);
}

function connect() {
  const es = new EventSource("/api/events");
  const conn = document.getElementById("connection");
  es.addEventListener("open", () => { conn.textContent = "live"; conn.className = "connection up"; });
  es.addEventListener("error", () => { conn.textContent = "reconnecting"; conn.className = "connection down"; });
  es.addEventListener("snapshot", (ev) => {
    const f = JSON.parse(ev.data);
    setDomains(f.domainLabel, f.domains);
    load(f.nodes || []);
    render(f.summary, f.notes);
    document.body.dataset.loaded = "true";
  });
  es.addEventListener("update", (ev) => {
    const u = JSON.parse(ev.data);
    if (setDomains(u.domainLabel, u.domains)) {
      // Grouped anew: every tile to its new group, in order.
      for (const r of u.changed) rows.set(r.node, r);
      for (const name of u.removed) remove(name);
      load([...rows.values()].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0)));
    } else {
      for (const r of u.changed) upsert(r);
      for (const name of u.removed) remove(name);
    }
    render(u.summary, u.notes);
    if (selected && u.changed.some((r) => r.node === selected)) explain(selected);
  });
  es.addEventListener("problem", (ev) => {
    document.getElementById("notes").replaceChildren(el("p", "", "problem: " + JSON.parse(ev.data).message));
  });
}

function dd(list, term, value) {
  list.append(el("dt", "", term), el("dd", "", value));
}

async function explain(node) {
  const prev = tiles.get(selected);
  if (prev) prev.classList.remove("selected");
  selected = node;
  const t = tiles.get(node);
  if (t) t.classList.add("selected");
  const aside = document.getElementById("story");
  aside.hidden = false;
  document.getElementById("story-title").textContent = node;
  const status = document.getElementById("story-status");
  status.textContent = "loading…";
  let st;
  try {
    const resp = await fetch("/api/explain?node=" + encodeURIComponent(node));
    if (!resp.ok) throw new Error(await resp.text());
    st = await resp.json();
  } catch (e) {
    status.textContent = "could not load the story: " + e.message;
    return;
  }
  if (selected !== node) return;
  status.textContent = (st.notes || []).map((n) => "note: " + n).join(" ");
  const r = st.row;
  const dl = document.getElementById("story-row");
  dl.replaceChildren();
  dd(dl, "state", r.state);
  dd(dl, "pool", r.pool || "-");
  if (r.domain) dd(dl, "domain", r.domain);
  if (r.computeDomain) dd(dl, "ComputeDomain", r.computeDomain.name || r.computeDomain.uid);
  if (r.problems) dd(dl, "problems", r.problems.join("; "));
  const g = r.gpus;
  dd(dl, "GPUs", `${g.capacity} capacity, ${g.allocatable} allocatable, ${g.inUse ?? "-"} in use, ${g.faulty ?? "-"} faulty`);
  dd(dl, "GPU stack", (r.stack || []).map((c) => c.name + " " + c.status).join(", ") || "-");
  const m = r.maintenance;
  dd(dl, "maintenance", m ? `${m.requestor} ${m.phase}${m.waiting ? ": " + m.waiting : ""}` : "-");
  const rp = r.repair;
  dd(dl, "repair", rp ? `${rp.phase} ${rp.fault} since ${rp.since}` : "-");
  const body = document.getElementById("story-entries");
  body.replaceChildren(...(st.entries || []).map((e) => {
    const tr = el("tr", e.warning ? "warning" : "");
    tr.append(el("td", "time", String(e.time).replace("T", " ").replace("Z", "")), el("td", "", e.object), el("td", "", e.what));
    return tr;
  }));
}

document.getElementById("close").addEventListener("click", () => {
  document.getElementById("story").hidden = true;
  const t = tiles.get(selected);
  if (t) t.classList.remove("selected");
  selected = "";
});
connect();
