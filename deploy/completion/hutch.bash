# bash completion for hutch (installed by `make install`)
_hutch() {
        local cur prev verb
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        verb=${COMP_WORDS[1]}
        if ((COMP_CWORD == 1)); then
                COMPREPLY=($(compgen -W "run serve key volume template audit usage ps exec logs kill router node gc doctor version help" -- "$cur"))
                return
        fi
        case $verb in
        run)
                case $prev in
                --backend) COMPREPLY=($(compgen -W "ns gvisor" -- "$cur")); return ;;
                --user | -u) COMPREPLY=($(compgen -W "user root" -- "$cur")); return ;;
                --net) COMPREPLY=($(compgen -W "deny allow" -- "$cur")); return ;;
                --workdir | -w) COMPREPLY=($(compgen -d -- "$cur")); return ;;
                esac
                [[ $cur == -* ]] && COMPREPLY=($(compgen -W "$(hutch run --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)" -- "$cur"))
                ;;
        serve)
                case $prev in
                --config | --tls-cert | --tls-key) COMPREPLY=($(compgen -f -- "$cur")); return ;;
                --data-dir | --run-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
                --backend) COMPREPLY=($(compgen -W "ns gvisor" -- "$cur")); return ;;
                esac
                [[ $cur == -* ]] && COMPREPLY=($(compgen -W "$(hutch serve --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)" -- "$cur"))
                ;;
        key) ((COMP_CWORD == 2)) && COMPREPLY=($(compgen -W "create list revoke" -- "$cur")) ;;
        volume) ((COMP_CWORD == 2)) && COMPREPLY=($(compgen -W "create ls rm" -- "$cur")) ;;
        audit) ((COMP_CWORD == 2)) && COMPREPLY=($(compgen -W "verify export pubkey" -- "$cur")) ;;
        node) ((COMP_CWORD == 2)) && COMPREPLY=($(compgen -W "drain undrain status" -- "$cur")) ;;
        router)
                case $prev in
                --key-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
                esac
                [[ $cur == -* ]] && COMPREPLY=($(compgen -W "$(hutch router --help 2>/dev/null | grep -o -- '--[a-z-]*' | sort -u)" -- "$cur"))
                ;;
        exec) ((COMP_CWORD == 2)) || [[ $cur == -* ]] || return
                [[ $cur == -* ]] && COMPREPLY=($(compgen -W "-i -t -e -u -w --interactive --tty --env --user --workdir" -- "$cur")) && return
                COMPREPLY=($(compgen -W "$(hutch ps -q 2>/dev/null)" -- "$cur")) ;;
        kill) COMPREPLY=($(compgen -W "$(hutch ps --json 2>/dev/null | grep -o '"id":"[a-z0-9]*"' | cut -d'"' -f4)" -- "$cur")) ;;
        ps) COMPREPLY=($(compgen -W "--json" -- "$cur")) ;;
        logs) COMPREPLY=($(compgen -W "-f --follow --since --kind --json --data-dir" -- "$cur")) ;;
        esac
}
complete -F _hutch hutch
