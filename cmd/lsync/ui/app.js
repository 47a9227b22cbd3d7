// The lsync status page: polls /api/status each second and follows
// /api/events. Plain DOM, no dependencies: it must work offline.
"use strict";

const $ = (sel) => document.querySelector(sel);
const names = {}; // device id → name
const libNames = {}; // library uuid → name

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function short(id) { return id ? String(id).slice(0, 8) : ""; }
function who(id) { return names[id] || short(id); }
function ago(t) {
  if (!t) return "never";
  const s = (Date.now() - new Date(t).getTime()) / 1000;
  return s < 2 ? "now" : dur(s) + " ago";
}
function dur(s) {
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  return Math.floor(s / 86400) + " d";
}
function num(n) { return Number(n || 0).toLocaleString("en"); }
function sum(m) { return Object.values(m || {}).reduce((a, b) => a + b, 0); }
function badge(text, cls) { return `<span class="badge ${esc(cls)}">${esc(text)}</span>`; }
// paused is the badge of what lsync sync pause paused here, since when
// (nothing when since is empty).
function paused(since, what) {
  return since ? ` <span class="badge paused" title="${esc(what)}, since ${esc(new Date(since).toLocaleString())} (lsync sync resume)">paused ${esc(ago(since))}</span>` : "";
}
function hlcTime(h) {
  // An HLC prints as milliseconds-counter-device; show the time.
  const m = /^(\d+)-/.exec(h || "");
  return m ? new Date(Number(m[1])).toISOString().replace("T", " ").slice(0, 19) : h || "";
}

// rate prints bytes per second as lsync sync limit does (decimal units).
function rate(v) {
  const units = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
  let i = 0;
  v = Math.max(0, Number(v || 0));
  while (v >= 999.95 && i < units.length - 1) { v /= 1000; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, "")) + " " + units[i];
}
function limit(v) { return v ? rate(v) : "none"; }
// flow is one direction: the rate now and the limit in force.
function flow(now, lim) {
  return `${esc(rate(now))}${lim ? ` <span class="muted">/ ${esc(limit(lim))}</span>` : ""}`;
}

let bandwidth = { peers: [] }; // the device's limits and rates (device show)

function renderDevice(d) {
  $("#device-name").textContent = d.name;
  $("#device-id").textContent = d.id;
  $("#device-listen").textContent = d.listen;
  names[d.id] = d.name;
  document.title = "lsync · " + d.name;
  bandwidth = d.bandwidth || { peers: [] };
  const bw = d.bandwidth;
  $("#device-bw").innerHTML = bw ? `<span class="muted">up</span> <b class="bw-up">${flow(bw.rates.up, bw.limits.up)}</b>
    <span class="muted">down</span> <b class="bw-down">${flow(bw.rates.down, bw.limits.down)}</b>` : "";
  $("#device-bw").title = bw ? `limits: up ${limit(bw.limits.up)}, down ${limit(bw.limits.down)} (lsync sync limit); rates over the last ${bw.window_seconds} s` : "";
}

function renderPeers(peers) {
  const bw = {};
  for (const b of bandwidth.peers || []) bw[b.id] = b;
  const rows = peers.map((p) => {
    names[p.id] = p.name;
    const b = bw[p.id] || { limits: {}, rates: {} };
    return `<tr class="peer" data-id="${esc(p.id)}">
      <td><b class="peer-name">${esc(p.name)}</b> <code>${esc(short(p.id))}</code></td>
      <td class="peer-state">${p.connected ? badge("connected", "on") : badge("offline", "off")}${paused(p.paused_since, "in every library")}${
        (p.paused_in || []).map((l) => paused(l.since, l.everyone ? `${l.name}, with every device` : `in ${l.name}`)).join("")}</td>
      <td>${p.connected ? esc(p.rtt_ms.toFixed(1)) + " ms" : ""}</td>
      <td class="peer-up">${p.connected ? flow(b.rates.up, b.limits.up) : b.limits.up ? "/ " + esc(limit(b.limits.up)) : ""}</td>
      <td class="peer-down">${p.connected ? flow(b.rates.down, b.limits.down) : b.limits.down ? "/ " + esc(limit(b.limits.down)) : ""}</td>
      <td>${esc(p.connected ? "now" : ago(p.last_seen))}</td>
      <td class="err">${esc(p.last_error || "")}</td></tr>`;
  });
  $("#peers tbody").innerHTML = rows.join("");
  $("#no-peers").hidden = peers.length > 0;
}

// renderNearby lists the unpaired devices heard on the local network
// (lsync network nearby); off says why there is no list.
function renderNearby(nearby, off) {
  const rows = (nearby || []).map((n) => `<tr class="nearby" data-id="${esc(n.id)}">
      <td><b class="nearby-name">${esc(n.name)}</b> <code>${esc(short(n.id))}</code></td>
      <td><code>${esc((n.addrs || []).join(" "))}</code></td>
      <td>${esc(ago(n.seen))}</td>
      <td>${n.pairing_open ? badge("code pending", "on") : ""}</td></tr>`);
  $("#nearby tbody").innerHTML = rows.join("");
  $("#no-nearby").hidden = rows.length > 0;
  $("#no-nearby").textContent = off || "No unpaired device heard on the local network.";
}

// takes says in words what a member takes of the library (its filters,
// selective sync): "all" without any.
function takes(fs) {
  if (!fs || !fs.length) return "all";
  return fs.map((f) => {
    const from = f.source ? "from " + (f.source_name || short(f.source)) : "from all";
    const what = f.models ? "only " + f.models.join(", ") : f.exclude_models ? "all but " + f.exclude_models.join(", ") : "every model";
    const locs = f.locations ? "; entries of " + f.locations.join(", ") : f.exclude_locations ? "; no entries of " + f.exclude_locations.join(", ") : "";
    return `${from}: ${what}${locs}`;
  }).join("; ");
}

function renderJoin(st) {
  const b = st.backfill;
  if (b) {
    const pct = b.expected_records > 0 ? Math.min(100, (100 * b.records) / b.expected_records) : 0;
    const eta = b.eta_seconds > 0 ? "ETA " + dur(b.eta_seconds) : "ETA unknown";
    return `<div class="join running">
      <div class="progress moving"><div class="bar" style="width:${pct.toFixed(1)}%"></div></div>
      joining from ${esc(who(b.source))}: <b class="join-records">${num(b.records)}</b> of ${b.expected_records ? num(b.expected_records) : "?"} records
      (${pct.toFixed(0)}%), ${esc(Math.round(b.records_per_sec))} records/s, ${esc(eta)}, ${num(b.pages)} pages
      ${b.attempts > 1 ? ", attempt " + esc(b.attempts) : ""}
      ${b.last_error ? `<div class="err">last error: ${esc(b.last_error)}</div>` : ""}</div>`;
  }
  const l = st.last_backfill;
  if (l) {
    return `<div class="join finished">
      <div class="progress"><div class="bar" style="width:100%"></div></div>
      join finished: <b class="join-records">${num(l.records)}</b> records in ${num(l.pages)} pages from ${esc(who(l.source))}</div>`;
  }
  return "";
}

function renderLibrary(l) {
  libNames[l.uuid] = l.name;
  if (!l.open || !l.status) {
    return `<div class="library" data-uuid="${esc(l.uuid)}"><div class="head"><h3 class="lib-name">${esc(l.name)}</h3>
      ${badge(l.open ? "open" : "closed", "")}</div>
      ${l.error || l.problem ? `<div class="err">${esc(l.error || l.problem)}</div>` : ""}</div>`;
  }
  const st = l.status;
  const peers = {};
  for (const p of st.peers || []) peers[p.id] = p;
  for (const m of l.members || []) if (m.name) names[m.id] = m.name;
  const members = (l.members || []).map((m) => {
    const p = peers[m.id] || {};
    const err = p.last_error || p.sync_error || p.antientropy_error || "";
    const state = m.self ? badge("this device", "") : m.removed ? badge("removed", "off") :
      m.connected ? badge("connected", "on") : m.partner ? badge("offline", "off") : badge("via partners", "");
    const held = m.self ? "" : paused(p.paused_since, "syncing this library with it");
    return `<tr class="member" data-id="${esc(m.id)}">
      <td><b>${esc(m.name || short(m.id))}</b></td><td class="member-state">${state}${held}</td>
      <td>${p.connected ? esc(p.rtt_ms.toFixed(1)) + " ms" : ""}</td>
      <td>${esc(m.last_sync ? ago(m.last_sync) : "")}</td>
      <td title="state ${esc(m.state_up_to || "")} / shared ${esc(m.shared_up_to || "")}">${esc(m.complete_up_to || "")}</td>
      <td class="lag">${m.lag_seconds == null ? "" : m.lag_seconds === 0 ? "in sync" : esc(dur(m.lag_seconds))}</td>
      <td class="takes">${esc(takes(m.filters))}</td>
      <td class="err">${esc(err)}</td></tr>`;
  });
  const waiting = (st.waiting || []).map((w) => `<div class="waiting">waiting for ${esc(w.model)} from ${esc(w.origin_name || short(w.origin))}: ${
    w.none_reachable ? "no reachable member holds them" : "asking the members that hold them"}</div>`);
  const verif = (st.verification || []).map((v) => `<tr class="verification" data-owner="${esc(v.owner)}">
      <td>${esc(who(v.owner))}</td><td class="verify-state">${badge(v.state, v.state)}</td>
      <td><code>${esc(hlcTime(v.watermark))}</code></td><td class="err">${esc(v.reason || "")}</td><td>${esc(v.last_repair || "")}</td></tr>`);
  const shared = (st.shared_models || []).map((v) => `${esc(v.name || short(v.device))}: ${badge(v.verdict, v.verdict === "match" ? "verified" : v.verdict === "differs" ? "unverified" : "")}`);
  const parked = sum(st.parked);
  // Revoked devices (issue 24): name, by whom, when, why.
  const revoked = (st.revoked || []).map((r) => `<tr class="revoked" data-id="${esc(r.id)}">
      <td><b>${esc(r.name || short(r.id))}</b></td><td>${esc(r.by_name || short(r.by))}</td>
      <td>${esc(r.at)}</td><td>${esc(r.reason || "")}${r.remove_rows ? " (rows removed)" : ""}</td></tr>`);
  return `<div class="library" data-uuid="${esc(l.uuid)}">
    <div class="head"><h3 class="lib-name">${esc(l.name)}</h3>
      <span class="lib-phase badge phase-${esc(st.phase)}">${esc(st.phase)}</span>${paused(st.paused_since, "with every device")}<code>${esc(l.uuid)}</code></div>
    ${st.error ? `<div class="err">stopped: ${esc(st.error)}</div>` : ""}
    ${st.revoked_here ? `<div class="err revoked-here">revoked: ${esc(st.revoked_here)}</div>` : ""}
    ${renderJoin(st)}
    <div class="facts">
      <span>log <b class="lib-log">${num(st.log_size)}</b></span>
      <span>pending shared <b>${num(st.pending_shared)}</b></span>
      <span>parked <b class="lib-parked">${num(parked)}</b>${sum(st.held) ? " (held " + num(sum(st.held)) + ")" : ""}</span>
      <span>failed <b class="lib-failed">${num(st.failed_records)}</b></span>
      <span>shared rows <b>${num(st.shared_rows)}</b></span>
      ${(st.jobs || []).length ? `<span>jobs <b>${esc(st.jobs.join(", "))}</b></span>` : ""}
      ${shared.length ? `<span>shared models: ${shared.join(" ")}</span>` : ""}
    </div>
    ${waiting.join("")}
    <table class="members"><thead><tr><th>Member</th><th>State</th><th>RTT</th><th>Last sync</th><th>Complete up to</th><th>Lag</th><th>Takes</th><th></th></tr></thead>
      <tbody>${members.join("")}</tbody></table>
    ${revoked.length ? `<table class="revocations"><thead><tr><th>Revoked device</th><th>By</th><th>At</th><th>Reason</th></tr></thead>
      <tbody>${revoked.join("")}</tbody></table>` : ""}
    ${renderConflicts(l.conflicts)}
    ${renderRevert(l.last_revert)}
    ${verif.length ? `<table class="verifications"><thead><tr><th>Owner</th><th>Verification</th><th>Watermark</th><th>Reason</th><th>Last repair</th></tr></thead>
      <tbody>${verif.join("")}</tbody></table>` : ""}
  </div>`;
}

// Recent conflicts: values that lost a concurrent edit (lsync conflicts).
function renderConflicts(cs) {
  if (!cs || !cs.length) return "";
  const val = (v) => v == null ? "(none)" : typeof v === "string" ? `"${v}"` : String(v);
  const rows = cs.map((c) => `<tr class="conflict" data-id="${esc(String(c.id))}">
      <td>${esc(String(c.id))}</td><td>${esc(ago(c.at))}</td>
      <td>${esc(c.model)} ${esc(c.record_name ? `"${c.record_name}"` : short(c.record))}</td><td>${esc(c.field)}</td>
      <td class="lost">${esc(val(c.value))} <span class="muted">by ${esc(c.lost_by_name || short(c.lost_by))}</span></td>
      <td>${esc(c.row_deleted ? "(row deleted)" : val(c.current))} <span class="muted">by ${esc(c.won_by_name || short(c.won_by))}</span></td></tr>`);
  return `<h4>Recent conflicts</h4><table class="conflicts"><thead><tr><th>ID</th><th>When</th><th>Row</th><th>Field</th><th>Lost</th><th>Kept</th></tr></thead>
      <tbody>${rows.join("")}</tbody></table>
    <p class="muted">Put a value back: <code>lsync conflicts restore LIB ID</code>.</p>`;
}

// The newest revert any member wrote (lsync revert): who undid whose
// changes, since when, how many rows.
function renderRevert(r) {
  if (!r) return "";
  return `<p class="last-revert">Last revert: <b>${esc(r.device_name || short(r.device))}</b> undid the changes of
    <b>${esc(r.target_name || short(r.target))}</b> (${esc(r.detail || "")}), ${esc(ago(r.time))}.</p>`;
}

function render(s) {
  renderDevice(s.device);
  renderPeers(s.peers);
  renderNearby(s.nearby, s.nearby_off);
  const libs = s.libraries.map(renderLibrary).join("");
  $("#libraries").innerHTML = `<h2>Libraries</h2>` + (libs || `<p class="muted">No library yet: <code>lsync library create NAME</code>.</p>`);
  showError(s.error || "");
}

function showError(msg) {
  $("#error").hidden = !msg;
  $("#error").textContent = msg;
}

let following = false;

async function poll() {
  try {
    const r = await fetch("api/status", { cache: "no-store" });
    if (!r.ok) throw new Error(r.status + " " + (await r.text()));
    render(await r.json());
    setConn(true);
    // Follow the events once names are known, so the feed can use them.
    if (!following) {
      following = true;
      follow();
    }
    renderFeed();
  } catch (e) {
    setConn(false);
    showError("cannot read the daemon's status: " + e.message);
  }
  setTimeout(poll, 1000);
}

function setConn(up) {
  const c = $("#conn");
  c.textContent = up ? "live" : "daemon unreachable";
  c.className = "badge " + (up ? "on" : "off");
}

function describe(e) {
  const parts = [];
  if (e.library) parts.push(libNames[e.library] || short(e.library));
  if (e.peer) parts.push(who(e.peer));
  if (e.model) parts.push(e.model + (e.count > 1 ? " ×" + e.count : ""));
  else if (e.type === "backfill_progress") parts.push(num(e.count) + " records");
  if (e.phase && e.type !== "backfill_progress") parts.push("→ " + e.phase);
  if (e.detail) parts.push(e.detail);
  return parts.join(" · ");
}

const events = []; // newest first, at most 200

function renderFeed() {
  $("#feed").innerHTML = events.map((e) => `<li class="event ev-${esc(e.type)}"><span class="t">${esc(new Date(e.time).toLocaleTimeString("en-GB"))}</span><span class="ty">${esc(e.type)}</span> ${esc(describe(e))}</li>`).join("");
}

function follow() {
  const es = new EventSource("api/events");
  es.onmessage = (m) => {
    const e = JSON.parse(m.data);
    // A join's progress is one line that moves, not a line per page.
    if (e.type === "backfill_progress") {
      const i = events.findIndex((x) => x.type === e.type && x.library === e.library);
      if (i >= 0) events.splice(i, 1);
    }
    events.unshift(e);
    events.length = Math.min(events.length, 200);
    renderFeed();
  };
}

poll();
