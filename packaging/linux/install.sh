#!/bin/sh
# Add Hearth to the application menu of this user's desktop, pointing at the folder this script is in.
#   ./install.sh              install the menu entry and icons under ${XDG_DATA_HOME:-~/.local/share}
#   ./install.sh --uninstall  remove them again (the Hearth folder itself is left alone)
# Move the folder first if you want it elsewhere (e.g. ~/.local/opt/hearth), then run this from there.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data=${XDG_DATA_HOME:-$HOME/.local/share}
desktop="$data/applications/hearth.desktop"
sizes="16 24 32 48 64 128 256 512"

if [ "${1:-}" = "--uninstall" ]; then
  rm -f "$desktop" "$data/icons/hicolor/scalable/apps/hearth.svg"
  for size in $sizes; do rm -f "$data/icons/hicolor/${size}x${size}/apps/hearth.png"; done
  echo "Removed Hearth from the application menu."
  exit 0
fi

if [ ! -x "$here/hearth" ] || [ ! -f "$here/share/hearth.desktop" ]; then
  echo "install.sh: run me from the unpacked Hearth folder (hearth and share/ beside me)" >&2
  exit 1
fi
case $here in
  *[\"\`\$\\]*) echo "install.sh: the folder path has a quote, backquote, dollar or backslash; move it" >&2; exit 1 ;;
esac

for size in $sizes; do
  mkdir -p "$data/icons/hicolor/${size}x${size}/apps"
  cp "$here/share/icons/hearth-$size.png" "$data/icons/hicolor/${size}x${size}/apps/hearth.png"
done
mkdir -p "$data/icons/hicolor/scalable/apps" "$data/applications"
cp "$here/share/icons/hearth.svg" "$data/icons/hicolor/scalable/apps/hearth.svg"
# Exec is quoted so a folder with spaces works; TryExec takes the plain path.
path=$(printf '%s' "$here" | sed 's/[&|]/\\&/g')  # & and | are special in the sed replacement below
sed -e "s|^Exec=hearth\$|Exec=\"$path/hearth\"|" -e "s|^TryExec=hearth\$|TryExec=$path/hearth|" \
  "$here/share/hearth.desktop" > "$desktop"
chmod 644 "$desktop"
# No cache updates: desktops watch these folders, and a per-user icon cache would go stale for other apps.
echo "Hearth is in the application menu ($desktop)."
