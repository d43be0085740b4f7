"use strict";
// Calls the broker's REST API as the signed-in approver (session cookie, CSRF token on every
// POST) or, where no OpenID Provider is configured, with a pasted bearer token (or none: an
// authenticating proxy in front sets Authorization). Every value from the server
// is placed with textContent or as text nodes: a report's content is data, never markup.
//
// What the approver reads must be what will be written: characters that reorder, hide or
// control text (bidi controls, zero-width, ESC, …) are never shown as themselves but as
// bordered marks ("U+202E RLO"), counted above the content. Which characters those are comes
// from the broker (marks.json, the same classifier as the in-band question), not from here.
(function () {
  const $ = (id) => document.getElementById(id);
  const status = (text) => { $("status").textContent = text; };
  const token = () => $("token").value.trim();
  let session = { mode: "token" }; // GET /approvals/session: how this page authenticates
  let marks = null; // sorted [first, last, label] runs of code points shown as marks
  let rightToLeft = null; // sorted [first, last] runs of right-to-left letters

  async function api(path, method, payload) {
    const headers = {};
    if (payload !== undefined) { headers["Content-Type"] = "application/json"; }
    if (session.mode === "token" && token()) { headers["Authorization"] = "Bearer " + token(); }
    if (session.mode === "oidc" && method && method !== "GET") { headers["X-CSRF-Token"] = session.csrf; }
    const response = await fetch(path, {
      method: method || "GET",
      headers: headers,
      body: payload === undefined ? undefined : JSON.stringify(payload),
      credentials: "same-origin",
      cache: "no-store",
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) { throw new Error(body.error || ("HTTP " + response.status)); }
    return body;
  }

  async function loadMarks() {
    if (marks) { return; }
    const response = await fetch("/approvals/marks.json", { cache: "no-store" });
    if (!response.ok) { throw new Error("HTTP " + response.status); }
    const tables = await response.json();
    marks = tables.marks;
    rightToLeft = tables.right_to_left;
  }

  // The run of `runs` (sorted [first, last, ...]) holding code point `cp`, or null.
  function find(runs, cp) {
    let lo = 0, hi = runs.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (cp < runs[mid][0]) { hi = mid - 1; } else if (cp > runs[mid][1]) { lo = mid + 1; } else { return runs[mid]; }
    }
    return null;
  }

  // Fills `element` with `text`, flagged characters as mark spans; returns how many marks, and
  // whether the text has right-to-left letters.
  function show(element, text) {
    element.replaceChildren();
    let plain = "", count = 0, rtl = false;
    for (const char of String(text)) { // by code point; a lone surrogate comes as itself
      const cp = char.codePointAt(0);
      const run = find(marks, cp);
      if (run === null) {
        plain += char;
        rtl = rtl || find(rightToLeft, cp) !== null;
        continue;
      }
      const label = run[2];
      if (plain) { element.appendChild(document.createTextNode(plain)); plain = ""; }
      const mark = document.createElement("span");
      mark.className = "mark";
      mark.textContent = "U+" + cp.toString(16).toUpperCase().padStart(4, "0") + " " + label;
      element.appendChild(mark);
      count += 1;
    }
    if (plain) { element.appendChild(document.createTextNode(plain)); }
    return { count, rtl };
  }

  function warning(count) {
    const noun = count === 1 ? "character is" : "characters are";
    return count + " invisible or control " + noun + " shown as marks";
  }

  // A time as the approver's clock and language show it; `seconds` is Unix time.
  const when = (seconds) => new Date(seconds * 1000).toLocaleString();

  // "in 14:05" until the approval expires, then "expired" (and it can no longer be approved).
  function countdown() {
    const now = Date.now() / 1000;
    document.querySelectorAll(".approval").forEach((card) => {
      const expires = Number(card.dataset.expires);
      const left = Math.floor(expires - now);
      const cell = card.querySelector(".expires");
      if (card.dataset.state !== "pending") { cell.textContent = when(expires); return; }
      if (left <= 0) {
        cell.textContent = "expired";
        card.querySelectorAll(".approve, .deny").forEach((b) => { b.disabled = true; });
        return;
      }
      const minutes = Math.floor(left / 60), secs = String(left % 60).padStart(2, "0");
      cell.textContent = "in " + minutes + ":" + secs + " (" + when(expires) + ")";
    });
  }

  async function decide(id, verb, card) {
    try {
      const reason = verb === "deny" ? card.querySelector(".reason").value : "";
      const path = "/v1/approvals/" + encodeURIComponent(id) + "/" + verb;
      const record = await api(path, "POST", reason ? { reason: reason } : undefined);
      card.dataset.state = record.state;
      show(card.querySelector(".state"), record.state);
      card.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      status("Recorded: " + record.state);
    } catch (err) { status("Not recorded: " + err.message); }
  }

  // The content is fetched when the approver asks for it; only then may they approve.
  async function reveal(item, card, known) {
    const button = card.querySelector(".reveal");
    button.disabled = true;
    try {
      const detail = known || await api("/v1/approvals/" + encodeURIComponent(item.approval_id));
      const content = card.querySelector(".content");
      const { count, rtl } = show(content, detail.content);
      const warn = card.querySelector(".count");
      warn.textContent = count ? warning(count) : "";
      warn.hidden = count === 0;
      // Right-to-left letters reorder the words and numbers beside them by the bidi rules:
      // the approver is told, and can see the characters in the order they are stored.
      card.querySelector(".rtl").hidden = !rtl;
      card.querySelector(".stored-order").addEventListener("change", (event) => {
        content.classList.toggle("in-stored-order", event.target.checked);
      });
      content.hidden = false;
      button.hidden = true;
      card.querySelector(".approve").disabled = detail.state !== "pending";
    } catch (err) {
      button.disabled = false;
      status("Could not load the content: " + err.message);
    }
  }

  // `detail`: the approval with its content, shown at once (an approve_url's own approval).
  function addCard(item, detail) {
    const card = $("card").content.firstElementChild.cloneNode(true);
    for (const field of ["filename", "requester", "sha256", "state"]) {
      show(card.querySelector("." + field), item[field]);
    }
    card.querySelector(".bytes").textContent = item.bytes + " bytes";
    card.querySelector(".created").textContent = when(item.created_at);
    card.dataset.expires = String(item.expires_at);
    card.dataset.state = item.state;
    card.querySelector(".reveal").addEventListener("click", () => reveal(item, card));
    card.querySelector(".approve").addEventListener("click", () => decide(item.approval_id, "approve", card));
    card.querySelector(".deny").addEventListener("click", () => decide(item.approval_id, "deny", card));
    card.querySelector(".deny").disabled = item.state !== "pending";
    $("list").appendChild(card);
    countdown();
    if (detail) { return reveal(item, card, detail); }
    return Promise.resolve();
  }

  async function pending() {
    const items = [];
    // Signed in: every tenant the organisation's claims give this person, one after another.
    const tenants = session.mode === "oidc" ? session.tenants : [null];
    for (const tenant of tenants) {
      let cursor = null;
      do { // metadata only, page by page
        const query = "?state=pending" + (tenant ? "&tenant=" + encodeURIComponent(tenant) : "")
          + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
        const page = await api("/v1/approvals" + query);
        items.push(...page.approvals);
        cursor = page.next_cursor || null;
      } while (cursor);
    }
    return items;
  }

  // The latest decided approvals (of each tenant the approver acts for), newest first.
  // A written report's receipt (docs/audit.md, "Receipts"): fetched with this page's
  // credentials (a bearer token cannot ride on a plain link) and saved as a file.
  function receiptCell(item) {
    const cell = document.createElement("td");
    if (item.state !== "consumed") { return cell; }
    const link = document.createElement("a");
    link.href = "#";
    link.className = "receipt";
    link.textContent = "Receipt";
    link.addEventListener("click", async (event) => {
      event.preventDefault();
      try {
        const receipt = await api("/v1/approvals/" + encodeURIComponent(item.approval_id) + "/receipt");
        const blob = new Blob([JSON.stringify(receipt, null, 1) + "\n"], { type: "application/json" });
        const save = document.createElement("a");
        save.href = URL.createObjectURL(blob);
        save.download = item.approval_id + ".receipt.json";
        save.click();
        URL.revokeObjectURL(save.href);
        status("Receipt saved: check it with docbroker audit verify-receipt");
      } catch (error) {
        status("No receipt yet: " + error.message);
      }
    });
    cell.appendChild(link);
    return cell;
  }

  async function recent() {
    const tenants = session.mode === "oidc" ? session.tenants : [null];
    const rows = [];
    for (const tenant of tenants) {
      const query = "?state=all&limit=50" + (tenant ? "&tenant=" + encodeURIComponent(tenant) : "");
      const page = await api("/v1/approvals" + query);
      rows.push(...page.approvals.filter((a) => a.decided_at));
    }
    rows.sort((a, b) => b.decided_at - a.decided_at);
    const body = $("recent-rows");
    body.replaceChildren();
    for (const item of rows.slice(0, 20)) {
      const row = document.createElement("tr");
      for (const value of [item.filename, item.requester, item.state, item.decided_by, when(item.decided_at)]) {
        const cell = document.createElement("td");
        show(cell, value); // names are data too: marks for what hides or reorders
        row.appendChild(cell);
      }
      row.appendChild(receiptCell(item));
      body.appendChild(row);
    }
    $("recent").hidden = rows.length === 0;
  }

  async function load() {
    status("Loading…");
    $("list").replaceChildren();
    try {
      await loadMarks();
      const wanted = new URLSearchParams(location.search).get("id");
      if (wanted) { // an approve_url: this one approval, whatever page of the listing it is on
        const detail = await api("/v1/approvals/" + encodeURIComponent(wanted));
        await addCard(detail, detail);
        await recent();
        status("");
        return;
      }
      const items = await pending();
      for (const item of items) { addCard(item, null); }
      await recent();
      status(items.length ? items.length + " pending" : "Nothing is waiting for approval.");
    } catch (err) { status("Could not load: " + err.message); }
  }

  async function logout() {
    try {
      const answer = await api("/approvals/logout", "POST");
      // RP-initiated logout: the provider's own session ends too, where it offers that.
      if (answer.logout_url) { location.assign(answer.logout_url); return; }
    } catch (err) { status("Sign-out failed: " + err.message); return; }
    location.reload();
  }

  async function start() {
    setInterval(countdown, 1000);
    $("load").addEventListener("click", load);
    $("logout").addEventListener("click", logout);
    try {
      const response = await fetch("/approvals/session", { credentials: "same-origin", cache: "no-store" });
      session = await response.json();
    } catch (err) { session = { mode: "token" }; }
    if (session.mode !== "oidc") { return; } // the pasted-token form, as before
    $("login").hidden = true;
    if (!session.signed_in) {
      const back = location.pathname + location.search;
      $("signin-link").href = "/approvals/login?return_to=" + encodeURIComponent(back);
      $("signin").hidden = false;
      return;
    }
    $("who-name").textContent = session.subject;
    $("who-tenants").textContent = session.tenants.join(", ");
    $("who").hidden = false;
    await load();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
