// Shared by the pages: the API key and user id (kept in this browser), and API calls.
"use strict";
const arloop = (() => {
  const store = window.localStorage;
  const key = () => store.getItem("arloop.apiKey") || "";
  const user = () => {
    let u = store.getItem("arloop.userId");
    if (!u) { u = "web-" + Math.random().toString(36).slice(2, 10); store.setItem("arloop.userId", u); }
    return u;
  };
  function headers(extra) {
    return Object.assign({ "Authorization": "Bearer " + key() }, extra || {});
  }
  async function api(path, options) {
    const opts = Object.assign({}, options || {});
    opts.headers = headers(opts.headers);
    const response = await fetch(path, opts);
    if (!response.ok) {
      let detail = response.statusText;
      try { detail = JSON.stringify((await response.json()).detail); } catch (e) { /* not JSON */ }
      throw new Error(response.status + ": " + detail);
    }
    return response;
  }
  function bindWho() {  // the header's API key and user fields
    const k = document.getElementById("api-key"), u = document.getElementById("user-id");
    if (k) { k.value = key(); k.addEventListener("change", () => { store.setItem("arloop.apiKey", k.value.trim()); document.dispatchEvent(new Event("arloop:key")); }); }
    if (u) { u.value = user(); u.addEventListener("change", () => store.setItem("arloop.userId", u.value.trim())); }
  }
  const pct = (x) => (x === null || x === undefined) ? "–" : (100 * x).toFixed(0) + "%";
  const num = (x, d) => (x === null || x === undefined) ? "–" : Number(x).toFixed(d === undefined ? 3 : d);
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c);
    return node;
  }
  return { key, user, headers, api, bindWho, pct, num, el };
})();
