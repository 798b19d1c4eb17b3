/*
 * page.js — prl report's page script (embedded into the page by report/embed.cmake; the data
 * is the JSON document of report.h in <script id="prl-data">). It draws every curve over
 * steps with uPlot, builds the events table and the sample browser, and marks what it drew
 * for tests and tools: each plot's element gets data-points (x values drawn), data-series
 * (curves) and data-filled (the fewest non-empty points of any curve) once uPlot has drawn
 * it, and <body> gets data-ready="1" when the whole page is built.
 *
 * What is plotted is chosen here by metric name (docs/report.md lists them): a curve whose
 * metric is absent from every step (or, for SFT's optional losses and loss scale, 0 in every
 * step: the term is off) is left out, and a plot with no curve left is named under
 * "not recorded in this run" instead of being drawn empty.
 */
(function () {
  'use strict';
  const doc = JSON.parse(document.getElementById('prl-data').textContent);
  const app = document.getElementById('app');
  const run = doc.run;
  const steps = doc.steps;
  const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2',
    '#7f7f7f', '#bcbd22', '#17becf'];

  /* ---------------------------------------------------------------- helpers */

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k);
    return e;
  }

  /* The number at a dotted path ("trainer.route_overlap.2"), or null. */
  function at(obj, path) {
    let o = obj;
    for (const k of path.split('.')) {
      if (o == null || typeof o !== 'object') return null;
      o = o[k];
    }
    return typeof o === 'number' && isFinite(o) ? o : null;
  }

  /* Axis and legend numbers: exponent form for the tiny and the huge (mismatch ~1e-7). */
  function fmtNum(v) {
    if (v == null) return '';
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(1);
    return String(+v.toPrecision(4));
  }

  function fmtTime(unix) {
    return new Date(unix * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  /* ---------------------------------------------------------------- plots */

  const RL_PLOTS = [
    { id: 'reward', title: 'Reward', y: 'mean reward', series: [
      ['every sample of the step', 'reward_mean'], ['trained samples', 'trainer.reward_mean']] },
    { id: 'accuracy', title: 'Accuracy (share of samples with reward 1)', y: 'accuracy', series: [
      ['every sample of the step', 'accuracy'], ['trained samples', 'trainer.accuracy']] },
    { id: 'kl', title: 'KL to the reference (k3) and policy drift', y: 'KL', series: [
      ['k3 KL to the reference', 'trainer.kl'], ['ppo_kl: mean(lp_old − lp_new)', 'trainer.ppo_kl']] },
    { id: 'opd_kl', title: 'OPD: reverse KL student → teacher', y: 'KL', series: [
      ['all teachers', 'trainer.opd_teacher_kl']], keys: ['trainer.opd_teacher_kl_by'] },
    { id: 'mismatch', title: 'Train–infer mismatch |Δlogp| (old train vs rollout log-prob)',
      y: '|Δlogp|', log: true, series: [['mean', 'trainer.mismatch'], ['max', 'trainer.mismatch_max']] },
    { id: 'mismatch_kl', title: 'Train–infer KL estimators (rollout → train)', y: 'KL', series: [
      ['k1', 'trainer.k1'], ['k2', 'trainer.k2'], ['k3', 'trainer.k3']] },
    { id: 'pcc', title: 'Train–infer Pearson correlation', y: 'PCC', series: [
      ['token probabilities', 'trainer.pcc'], ['log-probs', 'trainer.pcc_logprob']] },
    { id: 'masked', title: 'Masked and clipped fractions', y: 'share of loss tokens', series: [
      ['correction mask', 'trainer.corr_masked_frac'], ['MIS masked', 'trainer.mis_masked_frac'],
      ['IcePop masked', 'trainer.icepop_masked_frac'], ['KPop masked', 'trainer.kpop_masked_frac'],
      ['TIS clipped', 'trainer.tis_clipfrac'], ['OPD near-zero mask', 'trainer.opd_masked_frac'],
      ['PPO clipfrac', 'trainer.clipfrac']] },
    { id: 'route_overlap', title: 'Routing overlap per MoE layer (train vs rollout experts)',
      y: 'overlap', layers: 'trainer.route_overlap' },
    { id: 'route_entropy', title: 'Routing entropy per MoE layer (nats)', y: 'entropy',
      layers: 'trainer.route_entropy' },
    { id: 'loss', title: 'Policy loss', y: 'loss', series: [['loss', 'trainer.loss']] },
    { id: 'grad_norm', title: 'Gradient norm (pre-clip)', y: 'norm', series: [
      ['mean', 'trainer.grad_norm'], ['max', 'trainer.grad_norm_max']] },
    { id: 'loss_scale', title: 'Loss scale (fp16 training)', y: 'scale', log: true, series: [
      ['loss scale', 'trainer.loss_scale']] },
    { id: 'tokens_per_s', title: 'Rollout tokens/s', y: 'tokens/s', series: [
      ['generated tokens/s', 'tokens_per_s']] },
    { id: 'stage_time', title: 'Per-stage time', y: 'seconds', series: [
      ['rollout_s', 'rollout_s'], ['rollout_wait_s', 'rollout_wait_s'], ['score_tail_s', 'score_tail_s'],
      ['teach_s', 'teach_s'], ['train_s', 'train_s'], ['step_s', 'step_s'], ['interval_s', 'interval_s']] },
    { id: 'groups', title: 'Groups and samples', y: 'count', series: [
      ['groups kept', 'groups_kept'], ['groups dropped', 'groups_dropped'], ['stale samples', 'stale']] },
  ];
  const SFT_PLOTS = [
    { id: 'loss', title: 'Loss', y: 'loss', series: [['LM loss', 'loss'], ['balance', 'balance_loss'],
      ['z-loss', 'z_loss'], ['MTP', 'mtp_loss'], ['indexer', 'index_loss']], skipZero: true },
    { id: 'lr', title: 'Learning rate', y: 'lr', series: [['lr', 'lr']] },
    { id: 'grad_norm', title: 'Gradient norm (pre-clip)', y: 'norm', series: [['grad norm', 'grad_norm']] },
    { id: 'tokens_per_s', title: 'Training tokens/s', y: 'tokens/s', series: [['tokens/s', 'tokens_per_s']] },
    { id: 'loss_scale', title: 'Loss scale (fp16 training)', y: 'scale', log: true, series: [
      ['loss scale', 'loss_scale']], skipZero: true },
    { id: 'elapsed', title: 'Elapsed time', y: 'seconds', series: [['elapsed', 'elapsed_s']] },
  ];

  /* The curves of a spec: fixed series, per-layer arrays, or one curve per key of an object. */
  function curves(spec) {
    let list = (spec.series || []).map(([label, path]) => ({ label, path }));
    if (spec.layers) {
      let n = 0;
      for (const s of steps) {
        const a = spec.layers.split('.').reduce((o, k) => (o == null ? o : o[k]), s);
        if (Array.isArray(a)) n = Math.max(n, a.length);
      }
      for (let l = 0; l < n; l++) list.push({ label: 'MoE layer ' + l, path: spec.layers + '.' + l });
    }
    for (const base of spec.keys || []) {
      const names = new Set();
      for (const s of steps) {
        const o = base.split('.').reduce((v, k) => (v == null ? v : v[k]), s);
        if (o && typeof o === 'object') Object.keys(o).forEach((k) => names.add(k));
      }
      for (const k of [...names].sort()) list.push({ label: k, path: base + '.' + k });
    }
    return list.map((c) => {
      const ys = steps.map((s) => at(s, c.path));
      return { label: c.label, ys };
    }).filter((c) => c.ys.some((v) => v !== null && !(spec.skipZero && v === 0)));
  }

  /* Steps and versions are whole numbers: no tick at 0.5. */
  const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];

  /* A flat curve (a random policy's reward 0, a PCC of 1) gets a range around its value, not
  ** uPlot's 0..100 default. */
  function yRange(u, min, max) {
    if (min == null || max == null) return [0, 1];
    if (min === max) {
      if (min === 0) return [0, 1]; /* a share, a reward or a KL that stayed 0 */
      const pad = Math.abs(min) * 0.1;
      return [min - pad, max + pad];
    }
    return uPlot.rangeNum(min, max, 0.1, true);
  }

  /* After uPlot's draw: what was drawn, for tests (see the header). */
  function mark(box, u) {
    const ys = u.data.slice(1);
    box.dataset.points = String(u.data[0].length);
    box.dataset.series = String(ys.length);
    box.dataset.filled = String(Math.min(...ys.map((y) => y.filter((v) => v != null).length)));
    box.dataset.drawn = '1';
  }

  function drawPlot(parent, id, title, ylabel, xlabel, xs, cs, log) {
    const box = el('div', { class: 'plot', 'data-id': id });
    parent.append(box);
    const positive = cs.every((c) => c.ys.every((v) => v === null || v > 0));
    const y = log && positive ? { distr: 3 } : { range: yRange };
    const opts = {
      title, width: 640, height: 260,
      scales: { x: { time: false }, y },
      axes: [{ label: xlabel, incrs: STEP_INCRS },
        { label: ylabel, size: 70, values: (u, ticks) => ticks.map(fmtNum) }],
      series: [{ label: xlabel }].concat(cs.map((c, i) => ({
        label: c.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
        value: (u, v) => fmtNum(v),
        points: { show: xs.length <= 60 },
      }))),
      hooks: { draw: [(u) => mark(box, u)] },
    };
    new uPlot(opts, [xs].concat(cs.map((c) => c.ys)), box);
  }

  function stepPlots(parent, specs) {
    const xs = steps.map((s) => s.step);
    const missing = [];
    for (const spec of specs) {
      const cs = curves(spec);
      if (cs.length) drawPlot(parent, spec.id, spec.title, spec.y, 'step', xs, cs, spec.log);
      else missing.push(spec.title);
    }
    return missing;
  }

  /* In-run evaluations: one point per `eval` event, over the policy version evaluated. */
  function evalPlot(parent) {
    const evs = doc.events.filter((e) => e.kind === 'eval' && typeof e.detail.version === 'number');
    if (!evs.length) return false;
    const xs = evs.map((e) => e.detail.version);
    const cs = [{ label: 'all held-out problems', ys: evs.map((e) => at(e.detail, 'accuracy')) }];
    const keys = new Set();
    evs.forEach((e) => Object.keys(e.detail.by || {}).forEach((k) => keys.add(k)));
    for (const k of [...keys].sort())
      cs.push({ label: k, ys: evs.map((e) => at(e.detail, 'by.' + k + '.accuracy')) });
    if (evs.some((e) => at(e.detail, 'pass_k') !== null))
      cs.push({ label: 'pass@k (all)', ys: evs.map((e) => at(e.detail, 'pass_k')) });
    drawPlot(parent, 'eval', 'In-run evaluation: held-out accuracy per domain or verifier',
      'accuracy', 'policy version', xs, cs, false);
    return true;
  }

  /* ---------------------------------------------------------------- events */

  /* Event kinds that mean something went wrong (roles/controller/ writes them). */
  const ALARMS = /fault|restart|fail|stale|lost|requeue|rejoin|mismatch|collapse/;

  function eventsTable(parent) {
    if (!doc.events.length) {
      parent.append(el('p', { class: 'missing', text: 'No events recorded.' }));
      return;
    }
    const t = el('table', { class: 'events' });
    t.append(el('tr', {}, el('th', { text: '#' }), el('th', { text: 'time (UTC)' }),
      el('th', { text: 'kind' }), el('th', { text: 'detail' })));
    for (const e of doc.events) {
      const cls = ALARMS.test(e.kind) ? 'alarm' : e.kind === 'eval' ? 'eval' : e.kind === 'resume' ? 'resume' : '';
      t.append(el('tr', { class: cls }, el('td', { text: String(e.id) }),
        el('td', { text: fmtTime(e.time) }), el('td', { text: e.kind }),
        el('td', { text: JSON.stringify(e.detail) })));
    }
    parent.append(t);
  }

  /* ---------------------------------------------------------------- sample browser */

  /* White at log-prob 0, deep red at -6 and below. */
  function lpColor(lp) {
    if (lp === null) return '#ddd';
    const t = Math.min(1, Math.max(0, -lp / 6));
    return 'hsl(0, 85%, ' + (100 - 45 * t).toFixed(1) + '%)';
  }
  /* Red at reward 0, green at 1. */
  function rewardColor(r) {
    const t = Math.min(1, Math.max(0, r));
    return 'hsl(' + (120 * t).toFixed(0) + ', 70%, 75%)';
  }
  const STOP = ['end token', 'length', 'stop string', 'context', 'forced'];

  function showSample(view, s, by) {
    view.replaceChildren();
    view.append(el('div', { class: 'sample-head' },
      'step ' + s.step + ' · prompt ' + s.prompt_id + ' · sample ' + s.sample_index +
      ' · version ' + s.version + ' · ' + s.status + ' · stop: ' + (STOP[s.stop] || s.stop) + ' · reward ',
      el('span', { class: 'badge', style: 'background:' + rewardColor(s.reward),
        text: s.reward.toFixed(3) })));
    if (s.prompt !== null) view.append(el('pre', { class: 'prompt', text: s.prompt }));
    const box = el('div', { class: 'tokens' });
    s.tokens.forEach((text, i) => {
      const lp = s.logprobs[i];
      const masked = s.mask && s.mask[i] === 0;
      box.append(el('span', {
        class: masked ? 'nomask' : '',
        style: 'background:' + (by === 'reward' ? rewardColor(s.reward) : lpColor(lp)),
        title: 'id ' + s.ids[i] + ' · infer log-prob ' + (lp === null ? 'n/a' : lp.toFixed(4)) +
          ' · p ' + (lp === null ? 'n/a' : Math.exp(lp).toFixed(4)) + (masked ? ' · masked' : ''),
        text,
      }));
    });
    view.append(box);
    view.append(el('div', { class: 'legend', text: by === 'reward'
      ? 'Tokens tinted by the sample\'s reward (red 0 → green 1).'
      : 'Tokens coloured by the rollout\'s (infer) log-prob: white 0, deep red ≤ −6; hover for id, ' +
        'log-prob and probability; struck-through tokens have loss mask 0. run.db keeps no ' +
        'per-token train log-probs (the step\'s train–infer mismatch is plotted above; ' +
        'prl diagnose --ckpt CKPT --run ' + run.dir + ' --step ' + s.step +
        ' recomputes it per op and token).' }));
    view.append(el('pre', { class: 'detail', text: 'verifier detail: ' + JSON.stringify(s.detail, null, 2) }));
  }

  function sampleBrowser(parent) {
    const samples = doc.samples;
    if (!samples.length) {
      parent.append(el('p', { class: 'missing', text: 'No samples stored.' }));
      return;
    }
    parent.append(el('p', { class: 'summary', text: run.samples_shown + ' of ' + run.samples_total +
      ' samples (the first of each step by prompt and sample index; prl report --samples N)' +
      (run.tokenizer ? '; decoded with ' + run.tokenizer : '; no tokenizer.json found: token ids shown') }));
    const byStep = new Map();
    samples.forEach((s, i) => {
      if (!byStep.has(s.step)) byStep.set(s.step, []);
      byStep.get(s.step).push(i);
    });
    const stepSel = el('select', { id: 'sample-step' });
    for (const st of byStep.keys()) stepSel.append(el('option', { value: String(st), text: 'step ' + st }));
    const sampleSel = el('select', { id: 'sample-pick' });
    const bySel = el('select', { id: 'sample-colour' },
      el('option', { value: 'logprob', text: 'colour: infer log-prob' }),
      el('option', { value: 'reward', text: 'colour: reward' }));
    const view = el('div', { id: 'sample-view' });
    const redraw = () => showSample(view, samples[Number(sampleSel.value)], bySel.value);
    const fill = () => {
      sampleSel.replaceChildren();
      for (const i of byStep.get(Number(stepSel.value))) {
        const s = samples[i];
        sampleSel.append(el('option', { value: String(i),
          text: s.prompt_id + ' #' + s.sample_index + ' · reward ' + s.reward.toFixed(2) + ' · ' + s.status }));
      }
      redraw();
    };
    stepSel.addEventListener('change', fill);
    sampleSel.addEventListener('change', redraw);
    bySel.addEventListener('change', redraw);
    parent.append(el('div', { class: 'browser' }, stepSel, sampleSel, bySel), view);
    fill();
  }

  /* ---------------------------------------------------------------- page */

  function header() {
    document.title = 'prl report: ' + run.name;
    app.append(el('h1', { text: 'prl report: ' + run.name }));
    const parts = [run.kind.toUpperCase() + ' run', steps.length + ' steps',
      steps.length ? 'steps ' + steps[0].step + '–' + steps[steps.length - 1].step : null,
      run.status ? 'status ' + run.status : null,
      run.created ? 'created ' + fmtTime(run.created) : null, 'from ' + run.dir].filter((p) => p);
    app.append(el('p', { class: 'summary', text: parts.join(' · ') }));
    app.append(el('details', {}, el('summary', { text: run.kind === 'sft' ? 'recipe' : 'job config' }),
      el('pre', { text: JSON.stringify(run.config, null, 2) })));
  }

  function build() {
    header();
    app.append(el('h2', { text: 'Curves over steps' }));
    const plots = el('div', { class: 'plots', id: 'plots' });
    app.append(plots);
    const rl = run.kind !== 'sft';
    const missing = stepPlots(plots, rl ? RL_PLOTS : SFT_PLOTS);
    if (rl && !evalPlot(plots)) missing.push('In-run evaluation (task.eval_every is off)');
    if (missing.length)
      app.append(el('p', { class: 'missing', id: 'not-recorded',
        text: 'Not recorded in this run: ' + missing.join('; ') + '.' }));
    if (rl) {
      app.append(el('h2', { text: 'Events' }));
      eventsTable(app);
      app.append(el('h2', { text: 'Samples' }));
      sampleBrowser(app);
    } else {
      app.append(el('p', { class: 'missing',
        text: 'An SFT run keeps its metrics only (metrics.jsonl): no events and no samples.' }));
    }
    document.body.dataset.ready = '1';
  }

  build();
})();
