-- abx.nvim: :Abx and abx:// buffers. Options: require('abx').setup{...} (:help abx-setup).
if vim.g.loaded_abx then
  return
end
vim.g.loaded_abx = true

if vim.fn.has("nvim-0.7") ~= 1 then
  vim.notify("abx.nvim needs Neovim 0.7 or later", vim.log.levels.ERROR)
  return
end

require("abx.commands").setup_command()
require("abx.templates").setup_command()
require("abx.files").setup_autocmds()

vim.api.nvim_create_autocmd("VimLeavePre", {
  group = vim.api.nvim_create_augroup("abx_leave", { clear = true }),
  callback = function()
    require("abx").stop(true)
  end,
})
