// Read-only documents the extension shows (sandbox info, install reviews): a
// TextDocumentContentProvider on its own scheme, so they open as clean, read-only editors
// that never ask to be saved.
import * as vscode from 'vscode';

export const DOC_SCHEME = 'abx-doc';

export class AbxDocuments implements vscode.TextDocumentContentProvider, vscode.Disposable {
  private readonly contents = new Map<string, string>();
  private readonly emitter = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.emitter.event;

  provideTextDocumentContent(uri: vscode.Uri): string {
    return this.contents.get(uri.toString()) ?? '';
  }

  /**
   * Shows `content` read-only as `name` (its extension picks the language: `.json`, `.md`).
   * Showing the same name again replaces the content.
   */
  async show(name: string, content: string, options: vscode.TextDocumentShowOptions = { preview: true }): Promise<vscode.TextDocument> {
    const uri = vscode.Uri.from({ scheme: DOC_SCHEME, path: `/${name}` });
    const key = uri.toString();
    const known = this.contents.has(key);
    this.contents.set(key, content);
    if (known) this.emitter.fire(uri);
    const doc = await vscode.workspace.openTextDocument(uri);
    await vscode.window.showTextDocument(doc, options);
    return doc;
  }

  dispose(): void {
    this.emitter.dispose();
    this.contents.clear();
  }
}
