; Inno Setup script for Hearth's Windows installer (Inno Setup 6.3 or later: https://jrsoftware.org/isinfo.php).
; build_windows.ps1 compiles it after PyInstaller:
;   iscc /DAppVersion=0.1.0 /DSourceDir=..\..\dist\hearth /DIconFile=..\..\build\pyinstaller\hearth\icons\hearth.ico
;        /DOutputDir=..\..\dist packaging\windows\hearth.iss
; A per-user install by default (no administrator prompt); the person may choose an all-users one instead.

#ifndef AppVersion
  #error Pass /DAppVersion=<engine.__version__>
#endif
#ifndef SourceDir
  #define SourceDir "..\..\dist\hearth"
#endif
#ifndef OutputDir
  #define OutputDir "..\..\dist"
#endif

[Setup]
; AppId identifies Hearth across versions (upgrades, uninstall): never change it.
AppId={{6A0C7E2E-3B1D-4D0B-9C55-2F4B8E61A7D3}
AppName=Hearth
AppVersion={#AppVersion}
AppVerName=Hearth {#AppVersion}
AppPublisher=Hearth
DefaultDirName={autopf}\Hearth
DefaultGroupName=Hearth
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#OutputDir}
OutputBaseFilename=Hearth-{#AppVersion}-windows-x64-setup
#ifdef IconFile
SetupIconFile={#IconFile}
#endif
#ifdef Sign
; iscc /Shearthsign="signtool sign ... $f" /DSign=1: the installer and its uninstaller are signed as they are made.
SignTool=hearthsign
SignedUninstaller=yes
#endif
UninstallDisplayIcon={app}\Hearth.exe
UninstallDisplayName=Hearth
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#SourceDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\Hearth"; Filename: "{app}\Hearth.exe"
Name: "{autodesktop}\Hearth"; Filename: "{app}\Hearth.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\Hearth.exe"; Description: "{cm:LaunchProgram,Hearth}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Files PyInstaller's bootloader or Python may leave beside the program (conversations live elsewhere and stay).
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
