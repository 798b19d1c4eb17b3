// report_check.mjs — open a `prl report` page in headless Chromium (Debian's /usr/bin/chromium,
// driven by puppeteer-core) and check what it drew (tests/test_report.sh):
//   - no console error, no uncaught exception, no request leaving the file (it opens offline);
//   - the page finished building (<body data-ready="1">);
//   - every expected plot is there, uPlot drew it (data-drawn), with the expected number of
//     points (data-points), every curve holding at least one value (data-filled >= 1), and its
//     canvas has ink on it;
//   - optionally: the events table's rows and the first sample's token spans;
// then save a full-page screenshot. Prints "ok"/"FAIL" lines and "N passed, M failed"; exits 1
// on any failure.
// usage: node report_check.mjs PAGE.html SCREENSHOT.png [--plot ID=POINTS ...] [--events N]
//        [--tokens N] [--no-plot ID ...]
import puppeteer from 'puppeteer-core';
import path from 'node:path';

const [page_path, shot, ...rest] = process.argv.slice(2);
const want = { plots: new Map(), absent: [], events: null, tokens: null };
for (let i = 0; i < rest.length; i += 2) {
  const [flag, v] = [rest[i], rest[i + 1]];
  if (flag === '--plot') {
    const [id, n] = v.split('=');
    want.plots.set(id, Number(n));
  } else if (flag === '--no-plot') want.absent.push(v);
  else if (flag === '--events') want.events = Number(v);
  else if (flag === '--tokens') want.tokens = Number(v);
  else throw new Error('report_check: unknown argument ' + flag);
}

let pass = 0, fail = 0;
const check = (ok, what) => {
  if (ok) pass++; else fail++;
  console.log((ok ? 'ok   ' : 'FAIL ') + what);
};

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--allow-file-access-from-files'],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1400, height: 1000 });
  const errors = [];
  page.on('console', (m) => { if (m.type() === 'error') errors.push('console: ' + m.text()); });
  page.on('pageerror', (e) => errors.push('exception: ' + e.message));
  page.on('request', (r) => {
    const u = r.url();
    if (!u.startsWith('file:') && !u.startsWith('data:') && !u.startsWith('about:'))
      errors.push('network request: ' + u);
  });
  await page.goto('file://' + path.resolve(page_path), { waitUntil: 'load' });
  const ready = await page.waitForFunction(() => document.body.dataset.ready === '1',
    { timeout: 15000 }).then(() => true, () => false);
  check(ready, 'the page finished building (body data-ready)');
  check(errors.length === 0, 'no console error, exception or network request' +
    (errors.length ? ': ' + errors.join(' | ') : ''));

  const plots = await page.$$eval('.plot', (els) => els.map((e) => {
    const c = e.querySelector('canvas');
    let ink = 0;
    if (c) {
      const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) ink++;
    }
    return { id: e.dataset.id, drawn: e.dataset.drawn, points: Number(e.dataset.points),
      series: Number(e.dataset.series), filled: Number(e.dataset.filled), ink };
  }));
  const byId = new Map(plots.map((p) => [p.id, p]));
  for (const [id, n] of want.plots) {
    const p = byId.get(id);
    check(p && p.drawn === '1' && p.points === n && p.series >= 1 && p.filled >= 1 && p.ink > 100,
      `plot ${id}: drawn with ${n} points, every curve non-empty` +
      (p ? ` (drawn ${p.drawn}, ${p.points} points, ${p.series} curves, fewest filled ` +
        `${p.filled}, ${p.ink} inked pixels)` : ' (missing)'));
  }
  for (const id of want.absent) check(!byId.has(id), `plot ${id} is not drawn (not recorded)`);
  for (const p of plots)
    if (!want.plots.has(p.id)) check(p.filled >= 1, `plot ${p.id} (not listed) is not empty`);
  if (want.events !== null) {
    const rows = await page.$$eval('table.events tr', (r) => r.length - 1);
    check(rows === want.events, `events table: ${want.events} rows (has ${rows})`);
  }
  if (want.tokens !== null) {
    const spans = await page.$$eval('#sample-view .tokens span', (s) => s.length);
    check(spans === want.tokens, `sample browser: ${want.tokens} response tokens (has ${spans})`);
    // another step and the reward colouring redraw without error
    await page.evaluate(() => {
      const step = document.getElementById('sample-step');
      step.selectedIndex = step.options.length - 1;
      step.dispatchEvent(new Event('change'));
      const by = document.getElementById('sample-colour');
      by.value = 'reward';
      by.dispatchEvent(new Event('change'));
    });
    const after = await page.$$eval('#sample-view .tokens span', (s) => s.length);
    check(after > 0 && errors.length === 0, `sample browser: the last step's first sample ` +
      `shows ${after} tokens, no error`);
  }
  await page.screenshot({ path: shot, fullPage: true });
  console.log('screenshot: ' + shot);
} finally {
  await browser.close();
}
console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
