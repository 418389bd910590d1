/**
 * NotebookOS in JupyterLab.
 *
 * - A status bar item (`jp-NotebookOS-StatusItem`) naming the replica and host that ran the
 *   active notebook's last cell, its GPUs and its interactivity delay.
 * - A side panel ("NotebookOS"): the notebook's cell history (executor, host, GPUs, wait and
 *   why, interactivity delay, run time), what happened to the kernel's replicas (lost,
 *   replaced, rebuilt from a checkpoint), and the cluster (hosts, GPUs and who shares them,
 *   kernels).
 * - A tooltip on each cell's prompt with the same facts for that cell.
 *
 * - The kernel's platform state when it is not plainly running: hibernated (idle: its replicas
 *   stopped, its state kept in its checkpoint; a Wake button starts it ahead of the next cell),
 *   waking, hibernating (a lost replica or a rebuild shows as the notices of the cell it hit).
 *
 * Data: the `notebookos` block of each `execute_reply`'s metadata (the Global Scheduler's
 * front and the executor replica fill it), and the server extension's `/api/notebookos/kernels/
 * <id>` (fetched once after each reply, when the notebook becomes the current one or the page
 * visible again, never on a timer) and `/api/notebookos/cluster` (fetched when the panel opens
 * or its refresh button is pressed, and after a reply while the panel is visible, at most every
 * few seconds). No polling.
 */

import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelMessage, ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

/** One executed cell, as NotebookOS ran it. */
export interface ICellRun {
  cellId: string;
  executionCount: number | null;
  status: string;
  replicaId: number | null;
  hostId: string;
  gpus: number[];
  delayMs: number | null;
  waitedMs: number | null;
  waitedFor: string;
  waitReason: string;
  runMs: number | null;
  /** GPU-seconds the cell held (its GPUs x commit -> reply), null without GPUs. */
  gpuSeconds: number | null;
  notices: string[];
}

interface IReplica {
  replica_id: number;
  host_id: string;
  state: string;
}

interface IKernelEntry {
  id: string;
  state: string;
  executor: number | null;
  message: string;
  replicas: IReplica[];
  last_cell_gpus: { host_id: string; device_ids: number[] } | null;
  last_interactivity_delay_ms: number | null;
  /** GPU-hours the kernel's cells held, and what reserving its GPUs since it started would have. */
  gpu_hours_used?: number;
  gpu_hours_reserved?: number;
}

const CLUSTER_REFRESH_MS = 5000;
/** Kernel states in which no replica runs the notebook on purpose (the status item says so). */
const ASLEEP: Record<string, string> = {
  hibernating: 'hibernating',
  hibernated: 'hibernated (idle) · click, then Wake',
  waking: 'waking from hibernation'
};
const HISTORY_LIMIT = 200;

async function getJSON<T>(path: string): Promise<T | null> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, path);
  try {
    const response = await ServerConnection.makeRequest(url, {}, settings);
    if (!response.ok) {
      return null;
    }
    return (await response.json()) as T;
  } catch (reason) {
    console.warn('NotebookOS: GET', path, 'failed', reason);
    return null;
  }
}

/** A kernel's entry, or why it cannot be had now (the server extension's 503 message, e.g.
 * "the NotebookOS scheduler is restarting, retry in 8 s (attempt 4)", and when to ask again). */
async function getKernelEntry(
  kernelId: string
): Promise<{ entry: IKernelEntry | null; down: string; retryInS: number | null }> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(
    settings.baseUrl,
    `api/notebookos/kernels/${encodeURIComponent(kernelId)}`
  );
  try {
    const response = await ServerConnection.makeRequest(url, {}, settings);
    if (response.ok) {
      return { entry: (await response.json()) as IKernelEntry, down: '', retryInS: null };
    }
    if (response.status === 503) {
      const body = (await response.json().catch(() => ({}))) as Record<string, any>;
      const retry = body?.scheduler?.retry_in_s;
      return {
        entry: null,
        down: String(body.message || 'the NotebookOS scheduler is not reachable'),
        retryInS: typeof retry === 'number' ? retry : null
      };
    }
  } catch (reason) {
    console.warn('NotebookOS: GET', url, 'failed', reason);
  }
  return { entry: null, down: '', retryInS: null };
}

function isNotebookOS(kernel: Kernel.IKernelConnection | null | undefined): boolean {
  return !!kernel && kernel.name.startsWith('notebookos');
}

function gpuText(gpus: number[]): string {
  if (gpus.length === 0) {
    return 'no GPU';
  }
  return (gpus.length === 1 ? 'GPU ' : 'GPUs ') + gpus.join(',');
}

/** GPU time: "0.42 GPU-s", "3.1 GPU-min", "1.25 GPU-h". */
export function gpuTimeText(seconds: number | null): string {
  if (seconds === null) {
    return '-';
  }
  if (seconds < 60) {
    return `${seconds.toFixed(2)} GPU-s`;
  }
  if (seconds < 3600) {
    return `${(seconds / 60).toFixed(1)} GPU-min`;
  }
  return `${(seconds / 3600).toFixed(2)} GPU-h`;
}

/** The notebook's GPU time against what reserving its GPUs since it started would have held. */
export function gpuHoursText(used: number | null, reserved: number | null): string {
  if (used === null || reserved === null || reserved <= 0) {
    return 'This notebook asked for no GPU.';
  }
  const saved = Math.max(0, 1 - used / reserved) * 100;
  return (
    `GPU time: ${gpuTimeText(used * 3600)} used; a reservation since it started would have ` +
    `held ${gpuTimeText(reserved * 3600)} (${saved.toFixed(1)}% saved).`
  );
}

function msText(ms: number | null): string {
  if (ms === null || ms === undefined || Number.isNaN(ms)) {
    return '?';
  }
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`;
}

/** The sentence a person reads about one cell. */
export function describeRun(run: ICellRun): string {
  const where =
    run.replicaId !== null
      ? `replica ${run.replicaId} on ${run.hostId || '?'}`
      : `on ${run.hostId || '?'}`;
  let text = `${where}, ${gpuText(run.gpus)}, delay ${msText(run.delayMs)}`;
  if (run.waitedMs) {
    text += `, waited ${msText(run.waitedMs)}`;
    if (run.waitedFor) {
      text += ` (${run.waitedFor})`;
    }
  }
  if (run.runMs !== null) {
    text += `, ran ${msText(run.runMs)}`;
  }
  if (run.gpuSeconds !== null) {
    text += `, GPU time ${gpuTimeText(run.gpuSeconds)}`;
  }
  if (run.waitReason) {
    text += `. Why it waited: ${run.waitReason}`;
  }
  return text;
}

/** What NotebookOS knows about one kernel: its cell history and its replicas. */
class KernelRecord {
  runs: ICellRun[] = [];
  notices: string[] = [];
  requests = new Map<string, string>(); // execute_request msg_id -> cellId
  private replicas: IReplica[] | null = null;
  private message = '';
  state = '';
  stateMessage = '';
  gpuHoursUsed: number | null = null;
  gpuHoursReserved: number | null = null;
  /** Why the scheduler cannot be asked now (it is restarting), or ''. */
  schedulerDown = '';
  /** Called when a fetch changed what is known (the panel and item redraw). */
  onChange: (() => void) | null = null;
  private fetching: Promise<void> | null = null;
  private again = false;

  constructor(readonly kernelId: string) {}

  get last(): ICellRun | undefined {
    return this.runs[this.runs.length - 1];
  }

  /** Fetch the kernel's entry once (coalescing calls made while a fetch runs). */
  refresh(): Promise<void> {
    if (this.fetching) {
      this.again = true;
      return this.fetching;
    }
    this.fetching = (async () => {
      do {
        this.again = false;
        const { entry, down, retryInS } = await getKernelEntry(this.kernelId);
        this.schedulerDown = down;
        if (entry) {
          this.apply(entry);
        } else if (down && retryInS !== null) {
          // one look again when `notebookos up` retries the scheduler (not a polling loop)
          setTimeout(() => void this.refresh().then(() => this.onChange?.()),
                     (retryInS + 1) * 1000);
        }
      } while (this.again);
      this.fetching = null;
    })();
    return this.fetching;
  }

  private apply(entry: IKernelEntry): void {
    const seen: string[] = [];
    // Replicas stopped because the notebook hibernated were not lost: its message says so.
    if (this.replicas !== null && !(entry.state in ASLEEP)) {
      const now = new Map(entry.replicas.map(r => [r.replica_id, r]));
      const before = new Map(this.replicas.map(r => [r.replica_id, r]));
      for (const [id, r] of before) {
        if (!now.has(id)) {
          seen.push(`replica ${id} on ${r.host_id} was lost`);
        }
      }
      for (const [id, r] of now) {
        if (!before.has(id)) {
          seen.push(`replica ${id} started on ${r.host_id}`);
        }
      }
    }
    if (entry.message && entry.message !== this.message) {
      seen.push(entry.message);
    }
    this.message = entry.message;
    this.state = entry.state;
    this.stateMessage = entry.message;
    this.gpuHoursUsed = entry.gpu_hours_used ?? null;
    this.gpuHoursReserved = entry.gpu_hours_reserved ?? null;
    this.replicas = entry.replicas;
    this.notices.push(...seen);
    const last = this.last;
    if (last) {
      last.notices.push(...seen);
      // What the reply's block lacked, from the scheduler's view of the same cell.
      const executor = entry.replicas.find(r => r.replica_id === entry.executor);
      if (last.replicaId === null && entry.executor !== null) {
        last.replicaId = entry.executor;
      }
      if (!last.hostId) {
        last.hostId = entry.last_cell_gpus?.host_id || executor?.host_id || '';
      }
      if (last.gpus.length === 0 && entry.last_cell_gpus) {
        last.gpus = entry.last_cell_gpus.device_ids;
      }
      if (last.delayMs === null) {
        last.delayMs = entry.last_interactivity_delay_ms;
      }
    }
  }
}

/** Reads a reply's `notebookos` block into a cell run. */
export function runFromReply(
  reply: KernelMessage.IExecuteReplyMsg,
  cellId: string
): ICellRun {
  const metadata = (reply.metadata || {}) as Record<string, any>;
  const block = (metadata.notebookos || {}) as Record<string, any>;
  const started = Date.parse(metadata.started || '');
  const ended = Date.parse(reply.header.date || '');
  const num = (v: any): number | null => (typeof v === 'number' ? v : null);
  return {
    cellId,
    executionCount: (reply.content as any).execution_count ?? null,
    status: reply.content.status,
    replicaId: num(block.replica_id) ?? num(block.executor),
    hostId: block.host_id || '',
    gpus: Array.isArray(block.gpu_device_ids) ? block.gpu_device_ids : [],
    delayMs:
      num(block.interactivity_delay_ms) ??
      (num(block.interactivity_delay_s) !== null ? block.interactivity_delay_s * 1000 : null),
    waitedMs: num(block.waited_ms),
    waitedFor: block.waited_for || '',
    waitReason: block.wait_reason || '',
    runMs: Number.isFinite(started) && Number.isFinite(ended) ? ended - started : null,
    gpuSeconds: num(block.gpu_seconds),
    notices: []
  };
}

/** The status bar item: the active notebook's last cell. */
class StatusItem extends Widget {
  constructor() {
    super();
    this.addClass('jp-NotebookOS-StatusItem');
    this.node.textContent = 'NotebookOS';
  }

  show_(record: KernelRecord | null): void {
    if (record?.schedulerDown) {
      this.node.dataset.state = 'scheduler-restarting';
      this.node.textContent = 'NotebookOS: scheduler restarting';
      this.node.title = `${record.schedulerDown}\nA cell sent meanwhile waits and runs once it is back.`;
      return;
    }
    const asleep = record ? ASLEEP[record.state] : undefined;
    this.node.dataset.state = record?.state ?? '';
    if (record && asleep) {
      this.node.textContent = `NotebookOS: ${asleep}`;
      this.node.title = `${record.stateMessage || asleep}\nClick for the NotebookOS panel.`;
      return;
    }
    const last = record?.last;
    if (!record || !last) {
      this.node.textContent = 'NotebookOS: no cell run yet';
      this.node.title = 'NotebookOS: run a cell to see where it ran';
      return;
    }
    const where = `replica ${last.replicaId ?? '?'} @ ${last.hostId || '?'}`;
    this.node.textContent =
      `${last.notices.length ? '⚠ ' : ''}NotebookOS: ${where} · ` +
      `${gpuText(last.gpus)} · delay ${msText(last.delayMs)}`;
    this.node.dataset.host = last.hostId;
    this.node.dataset.replica = String(last.replicaId ?? '');
    this.node.title =
      `Last cell: ${describeRun(last)}` +
      (last.notices.length ? `\n${last.notices.join('\n')}` : '') +
      '\nClick for the cell history and the cluster.';
  }
}

/** The side panel: cell history, notices, cluster. */
class NotebookOSPanel extends Widget {
  private lastCluster = 0;
  private record: KernelRecord | null = null;
  private readonly history: HTMLElement;
  private readonly notices: HTMLElement;
  private readonly cluster: HTMLElement;
  private readonly kernelState: HTMLElement;
  private readonly gpuHours: HTMLElement;
  private readonly wake: HTMLButtonElement;
  /** Called after the Wake button asked the scheduler to wake the kernel. */
  onWake: (() => void) | null = null;

  constructor() {
    super();
    this.id = 'notebookos-panel';
    this.addClass('jp-NotebookOS-Panel');
    this.title.caption = 'NotebookOS: cells, replicas, cluster';
    this.title.label = 'NotebookOS';
    this.title.closable = true;
    const refresh = document.createElement('button');
    refresh.textContent = 'Refresh cluster';
    refresh.className = 'jp-NotebookOS-Refresh';
    refresh.onclick = () => void this.refreshCluster(true);
    this.history = document.createElement('div');
    this.notices = document.createElement('div');
    this.cluster = document.createElement('div');
    this.kernelState = document.createElement('p');
    this.kernelState.className = 'jp-NotebookOS-KernelState';
    this.gpuHours = document.createElement('p');
    this.gpuHours.className = 'jp-NotebookOS-GpuHours';
    this.wake = document.createElement('button');
    this.wake.textContent = 'Wake';
    this.wake.className = 'jp-NotebookOS-Wake';
    this.wake.title = 'Start the notebook\'s replicas from its checkpoint now, ahead of its next cell';
    this.wake.onclick = () => void this.wakeKernel();
    const heading = (text: string) => {
      const h = document.createElement('h3');
      h.textContent = text;
      return h;
    };
    this.node.append(
      heading('Kernel'),
      this.kernelState,
      this.gpuHours,
      this.wake,
      heading('Cells of this notebook'),
      this.history,
      heading('Replicas'),
      this.notices,
      heading('Cluster'),
      refresh,
      this.cluster
    );
  }

  setRecord(record: KernelRecord | null): void {
    this.record = record;
    if (this.isVisible) {
      this.render();
    }
  }

  protected onAfterShow(): void {
    this.onWake?.(); // the kernel's state now
    this.render();
    void this.refreshCluster(true);
  }

  /** After a reply: the cluster is refetched only while visible, at most every few seconds. */
  cellDone(): void {
    if (!this.isVisible) {
      return;
    }
    this.render();
    void this.refreshCluster(false);
  }

  private async wakeKernel(): Promise<void> {
    const record = this.record;
    if (!record) {
      return;
    }
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(
      settings.baseUrl,
      `api/notebookos/kernels/${encodeURIComponent(record.kernelId)}/wake`
    );
    this.wake.disabled = true;
    try {
      await ServerConnection.makeRequest(url, { method: 'POST' }, settings);
    } catch (reason) {
      console.warn('NotebookOS: wake failed', reason);
    }
    this.onWake?.();
  }

  render(): void {
    const state = this.record?.state || '';
    this.kernelState.textContent = !this.record
      ? 'Not a NotebookOS notebook.'
      : this.record.schedulerDown ||
        `${state || 'unknown'}${this.record.stateMessage ? ': ' + this.record.stateMessage : ''}`;
    this.kernelState.dataset.state = state;
    this.gpuHours.textContent = this.record
      ? gpuHoursText(this.record.gpuHoursUsed, this.record.gpuHoursReserved)
      : '';
    this.wake.hidden = state !== 'hibernated';
    this.wake.disabled = false;
    const runs = this.record ? [...this.record.runs].reverse() : [];
    if (runs.length === 0) {
      this.history.textContent = 'No cell has run on NotebookOS in this notebook yet.';
    } else {
      const table = document.createElement('table');
      table.className = 'jp-NotebookOS-History';
      table.innerHTML =
        '<tr><th>[n]</th><th title="executor replica">rep.</th><th>host</th>' +
        '<th>GPUs</th><th title="interactivity delay">delay</th>' +
        '<th title="waited before it was sent to its executor">wait</th>' +
        '<th title="run time">ran</th>' +
        '<th title="GPU-seconds its GPUs were bound while it ran">GPU time</th></tr>';
      for (const run of runs) {
        const row = table.insertRow();
        const cells = [
          run.executionCount === null ? '' : String(run.executionCount),
          run.replicaId === null ? '?' : String(run.replicaId),
          run.hostId || '?',
          run.gpus.join(',') || '-',
          msText(run.delayMs),
          run.waitedMs ? `${msText(run.waitedMs)} ${run.waitedFor}`.trim() : '-',
          msText(run.runMs),
          gpuTimeText(run.gpuSeconds)
        ];
        for (const text of cells) {
          row.insertCell().textContent = text;
        }
        row.title = describeRun(run) + (run.notices.length ? '\n' + run.notices.join('\n') : '');
        if (run.status !== 'ok') {
          row.classList.add('jp-NotebookOS-Failed');
        }
      }
      this.history.replaceChildren(table);
    }
    const notices = this.record?.notices ?? [];
    this.notices.textContent = notices.length
      ? ''
      : 'No replica was lost or rebuilt since this notebook connected.';
    if (notices.length) {
      const list = document.createElement('ul');
      for (const text of notices) {
        list.appendChild(document.createElement('li')).textContent = text;
      }
      this.notices.replaceChildren(list);
    }
  }

  async refreshCluster(force: boolean): Promise<void> {
    const now = Date.now();
    if (!force && now - this.lastCluster < CLUSTER_REFRESH_MS) {
      return;
    }
    this.lastCluster = now;
    const doc = await getJSON<any>('api/notebookos/cluster');
    if (!doc) {
      this.cluster.textContent = 'The NotebookOS Global Scheduler is not reachable.';
      return;
    }
    const table = document.createElement('table');
    table.className = 'jp-NotebookOS-Hosts';
    table.innerHTML =
      '<tr><th>host</th><th>GPUs</th><th>committed</th><th>pending</th><th>SR</th>' +
      '<th title="GPUs two kernels\' cells share now">shared</th></tr>';
    for (const h of doc.hosts) {
      const row = table.insertRow();
      const shared = (h.shared_gpus || [])
        .map((g: any) => `GPU ${g.device_id}: ${g.replicas.join(' + ')}`)
        .join('; ');
      for (const text of [
        h.id,
        String(h.gpus.total),
        String(h.gpus.committed),
        String(h.gpus.pending),
        Number(h.subscription_ratio).toFixed(2),
        shared || '-'
      ]) {
        row.insertCell().textContent = text;
      }
    }
    const summary = document.createElement('p');
    summary.textContent =
      `policy ${doc.policy}: ${doc.hosts.length} host(s), GPUs ${doc.gpus.committed} ` +
      `committed / ${doc.gpus.pending} pending / ${doc.gpus.total} total, ` +
      `${doc.kernels.length} kernel(s)`;
    this.cluster.replaceChildren(summary, table);
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'notebookos-jupyterlab:plugin',
  description: 'Where each cell ran on NotebookOS, and the cluster.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    statusBar: IStatusBar | null,
    labShell: ILabShell | null
  ) => {
    const records = new Map<string, KernelRecord>();
    const watched = new WeakSet<Kernel.IKernelConnection>();
    const panel = new NotebookOSPanel();
    const item = new StatusItem();

    const recordOf = (kernel: Kernel.IKernelConnection): KernelRecord => {
      let record = records.get(kernel.id);
      if (!record) {
        record = new KernelRecord(kernel.id);
        record.onChange = () => update();
        records.set(kernel.id, record);
      }
      return record;
    };
    const current = (): KernelRecord | null => {
      const kernel = tracker.currentWidget?.sessionContext.session?.kernel;
      return isNotebookOS(kernel) && kernel ? recordOf(kernel) : null;
    };
    const update = () => {
      item.setHidden(current() === null); // shown for NotebookOS notebooks only
      item.show_(current());
      panel.setRecord(current());
    };

    const annotate = (notebook: NotebookPanel, run: ICellRun) => {
      for (const cell of notebook.content.widgets) {
        if (cell.model.id === run.cellId) {
          const prompt = cell.node.querySelector('.jp-InputPrompt') as HTMLElement | null;
          const text =
            `NotebookOS: ${describeRun(run)}` +
            (run.notices.length ? '\n' + run.notices.join('\n') : '');
          (prompt ?? cell.node).title = text;
          cell.node.dataset.notebookosHost = run.hostId;
        }
      }
    };

    const watch = (notebook: NotebookPanel, kernel: Kernel.IKernelConnection | null) => {
      if (!kernel || watched.has(kernel) || !isNotebookOS(kernel)) {
        return;
      }
      watched.add(kernel);
      const record = recordOf(kernel);
      void record.refresh(); // the replicas as they are now, to tell losses later
      kernel.anyMessage.connect((_, args) => {
        const msg = args.msg;
        if (args.direction === 'send' && msg.header.msg_type === 'execute_request') {
          const cellId = String((msg.metadata as any)?.cellId ?? '');
          record.requests.set(msg.header.msg_id, cellId);
        } else if (args.direction === 'recv' && msg.header.msg_type === 'execute_reply') {
          const parent = (msg.parent_header as any)?.msg_id ?? '';
          const cellId = record.requests.get(parent) ?? '';
          record.requests.delete(parent);
          const run = runFromReply(msg as KernelMessage.IExecuteReplyMsg, cellId);
          record.runs.push(run);
          if (record.runs.length > HISTORY_LIMIT) {
            record.runs.shift();
          }
          update();
          void record.refresh().then(() => {
            annotate(notebook, run);
            update();
            panel.cellDone();
          });
        }
      });
    };

    tracker.widgetAdded.connect((_, notebook) => {
      const session = notebook.sessionContext;
      session.kernelChanged.connect((_, change) => {
        watch(notebook, change.newValue);
        update();
      });
      void session.ready.then(() => {
        watch(notebook, session.session?.kernel ?? null);
        update();
      });
    });
    // The kernel's state may have changed while nobody looked (it hibernated): ask again when
    // the notebook becomes the current one, or the page visible again. No timer.
    const refreshCurrent = () => {
      const record = current();
      if (record) {
        void record.refresh().then(update);
      }
    };
    tracker.currentChanged.connect(() => {
      update();
      refreshCurrent();
    });
    document.addEventListener('visibilitychange', () => {
      if (document.visibilityState === 'visible') {
        refreshCurrent();
      }
    });
    panel.onWake = refreshCurrent;

    app.commands.addCommand('notebookos:open-panel', {
      label: 'NotebookOS: cells, replicas and cluster',
      execute: () => {
        if (!panel.isAttached) {
          app.shell.add(panel, 'right', { rank: 900 });
        }
        app.shell.activateById(panel.id);
      }
    });
    item.node.onclick = () => void app.commands.execute('notebookos:open-panel');
    if (labShell) {
      labShell.add(panel, 'right', { rank: 900 });
    }
    if (statusBar) {
      statusBar.registerStatusItem('notebookos-jupyterlab:status', {
        item,
        align: 'left',
        rank: 5
      });
    }
    update();
  }
};

export default plugin;
