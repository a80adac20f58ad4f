// The status bar item: broker state and sandbox count; a click opens the broker menu.
import * as vscode from 'vscode';
import type { AbxService } from './service';

export function createStatusBar(service: AbxService): vscode.Disposable {
  const item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 50);
  item.name = 'abx broker';
  item.command = 'abx.showBrokerStatus';
  const update = () => {
    const st = service.state;
    item.backgroundColor = undefined;
    switch (st.kind) {
      case 'idle':
        item.text = '$(vm-outline) abx';
        item.tooltip = 'abx broker: not connected yet. Click for actions.';
        break;
      case 'connecting':
        item.text = '$(sync~spin) abx';
        item.tooltip = service.stale ? 'abx broker: reconnecting…' : 'abx broker: connecting…';
        break;
      case 'connected': {
        const list = service.sandboxes;
        const n = list?.length;
        const running = list?.filter((s) => s.status === 'running').length ?? 0;
        item.text = n === undefined ? '$(vm) abx' : `$(vm) abx: ${n}`;
        item.tooltip =
          `abx broker ${st.version}: connected` +
          (n === undefined ? '' : `\n${n} sandbox${n === 1 ? '' : 'es'} (${running} running, ${n - running} paused)`) +
          '\nClick for actions.';
        break;
      }
      case 'stopped':
        item.text = '$(debug-stop) abx: stopped';
        item.tooltip = 'abx broker: stopped. It starts again when you ask for it (a command, or Start Broker). Click for actions.';
        break;
      case 'error':
        item.text = '$(vm-outline) abx: offline';
        item.tooltip = `${st.error.headline}${st.error.suggestion ? `\nSuggestion: ${st.error.suggestion}` : ''}\nClick for actions.`;
        item.backgroundColor = new vscode.ThemeColor('statusBarItem.errorBackground');
        break;
    }
  };
  update();
  item.show();
  const subs = [service.onDidChangeState(update), service.onDidChangeSandboxes(update)];
  return new vscode.Disposable(() => {
    subs.forEach((s) => s.dispose());
    item.dispose();
  });
}
